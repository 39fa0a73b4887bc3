"""The register blocks' vector FMA (`c_vectors`) calls gcc's x86 builtins directly instead of
`<immintrin.h>`'s wrappers: parsing that header under `-march=native` cost gcc 0.4 s per
translation unit. The builtins must round lane by lane as `fmaf`/`fma` do, for every vector
width, including the AVX-512 ones this machine may not run (those are compiled only)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from einjit.backends import c_vectors

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="x86-64 Linux gcc")

CHECK = r"""
#include <math.h>
#include <stdio.h>
#include <string.h>
%s
#define CHECK(T, E, N, FMA, LOAD)                                                       \
  {                                                                                    \
    E a[N], b[N], c[N], got[N];                                                        \
    for (int i = 0; i < N; ++i) {                                                      \
      a[i] = (E)(1.0 + i * 1e-3) / 3; b[i] = (E)(7.0 - i) / 11; c[i] = -(E)(a[i] * b[i]); \
    }                                                                                  \
    T r = FMA(LOAD(a), LOAD(b), LOAD(c));                                                 \
    memcpy(got, &r, sizeof r);                                                         \
    for (int i = 0; i < N; ++i)                                                        \
      if (got[i] != (sizeof(E) == 4 ? fmaf(a[i], b[i], c[i]) : fma(a[i], b[i], c[i]))) \
        return 1;                                                                      \
  }
int main(void) {
  CHECK(einjit_f32x8, float, 8, einjit_fma_f32x8, einjit_load_f32x8)
  CHECK(einjit_f32x4, float, 4, einjit_fma_f32x4, einjit_load_f32x4)
  CHECK(einjit_f64x4, double, 4, einjit_fma_f64x4, einjit_load_f64x4)
  CHECK(einjit_f64x2, double, 2, einjit_fma_f64x2, einjit_load_f64x2)
  puts("ok");
  return 0;
}
"""


def helpers(*names: str) -> str:
    return "".join(c_vectors.HELPERS[n].format(q="static inline") for n in names)


def test_no_intrinsics_header_is_parsed():
    text = helpers(*c_vectors.HELPERS)
    assert "#include" not in text and "__builtin_ia32_vfmaddps256(a, b, c)" in text


def test_the_fma_builtins_round_as_fmaf_on_this_cpu(tmp_path):
    cpu = open("/proc/cpuinfo").read()
    if " fma " not in cpu:
        pytest.skip("no FMA on this CPU: the helpers take their scalar fallback")
    src = tmp_path / "fma.c"
    src.write_text(CHECK % helpers("vector_f32x8", "vector_f32x4", "vector_f64x4", "vector_f64x2"))
    exe = tmp_path / "fma"
    subprocess.run(["gcc", "-O2", "-march=native", "-ffp-contract=off", "-o", str(exe), str(src), "-lm"], check=True)
    done = subprocess.run([str(exe)], capture_output=True, text=True)
    assert (done.returncode, done.stdout.strip()) == (0, "ok")


@pytest.mark.parametrize("march", ["x86-64-v3", "skylake-avx512"])
def test_every_width_compiles_to_vector_fmas(tmp_path, march):
    """On an AVX-512 target the 16-float and 8-double helpers use the masked builtins with an
    all-ones mask; on AVX2 those take the lane loop. Each helper is one FMA instruction."""
    names = ["vector_f32x8", "vector_f64x4", "vector_f32x4", "vector_f64x2"]
    if march == "skylake-avx512":
        names += ["vector_f32x16", "vector_f64x8"]
    src = tmp_path / "widths.c"
    body = "\n".join(f"einjit_{n[7:]} fma_{n[7:]}(einjit_{n[7:]} a, einjit_{n[7:]} b, einjit_{n[7:]} c) "
                     f"{{ return einjit_fma_{n[7:]}(a, b, c); }}" for n in names)
    src.write_text("#include <math.h>\n#include <string.h>\n" + helpers(*names) + body)
    obj = tmp_path / "widths.o"
    subprocess.run(["gcc", "-O2", f"-march={march}", "-ffp-contract=off", "-c", "-o", str(obj), str(src)], check=True)
    disasm = subprocess.run(["objdump", "-d", str(obj)], capture_output=True, text=True, check=True).stdout
    assert disasm.count("vfmadd") == len(names)
