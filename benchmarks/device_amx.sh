#!/usr/bin/env bash
# AMX checks and figures on a CPU with AMX (Sapphire Rapids class), in one run of under 3 minutes:
# the AMX tests (tests/ir/test_amx_tiles.py: the tile kernels within the float32 bound at 1 and 2
# threads, the proof that tdpbf16ps ran, the mixed-precision step; the bf16 and machine tests
# beside them), then bench_bf16's matmul rows n=256/512/1024 at 1 thread (einjit AMX against
# torch bf16, einjit fp32, NumPy fp32) and the mixed-bf16 MLP, convnet and GPT step rows.
#
#   cd <repository root> && PYTHONPATH=src bash benchmarks/device_amx.sh
#
# Each section has its own time limit and the script goes on after a failure; without pytest the
# hardware tests run through a small direct runner instead.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="${PYTHONPATH:-src}"
export EINJIT_NUM_THREADS=1 OMP_NUM_THREADS=1 MKL_NUM_THREADS=1
EINJIT_CACHE_DIR="$(mktemp -d)"
export EINJIT_CACHE_DIR
unset EINJIT_MACHINE

echo "== machine"
grep -m1 "model name" /proc/cpuinfo
grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(amx|avx512_bf16|avx512f$)' | tr '\n' ' '
echo
gcc --version | head -1
python -c "import sys, numpy; print('python', sys.version.split()[0], 'numpy', numpy.__version__)"
python -c "import torch; print('torch', torch.__version__)" 2>/dev/null || echo "torch: not installed"
python -c "from einjit.ir.sched.machine import host_machine, _host_kind; print('einjit machine:', _host_kind())"
echo "uptime: $(uptime)"

echo "== AMX tests"
if python -c "import pytest" 2>/dev/null; then
  timeout 150 python -m pytest -q -p no:randomly -p no:cacheprovider \
    tests/ir/test_amx_tiles.py tests/ir/test_machine.py tests/ir/test_bf16.py
  echo "pytest exit: $?"
else
  echo "pytest not installed: running the hardware tests directly"
  timeout 150 python - <<'EOF'
import sys
sys.path.insert(0, "tests/ir")
import test_amx_tiles as t

assert t.cpu_has_amx(), "this CPU has no AMX"
failed = 0
for case in [(17, 35, 18, False), (96, 200, 80, True), (256, 256, 256, False)]:
    for threads in (1, 2):
        try:
            t.test_hardware_tiles_within_the_float32_bound(*case, threads)
            print("ok  ", case, threads)
        except Exception as e:  # report every case, then fail
            failed += 1
            print("FAIL", case, threads, repr(e)[:300])
try:
    t.test_hardware_runs_the_tile_code()
    print("ok   the tile code ran")
except Exception as e:
    failed += 1
    print("FAIL the tile code ran:", repr(e)[:300])
sys.exit(failed)
EOF
  echo "direct tests exit: $?"
fi

echo "== bf16 matmul, 1 thread"
timeout 120 python benchmarks/bench_bf16.py --matmul --sizes 256,512,1024
echo "== mixed bf16 steps, 1 thread"
timeout 150 python benchmarks/bench_bf16.py --steps
echo "uptime: $(uptime)"
rm -rf "$EINJIT_CACHE_DIR"
