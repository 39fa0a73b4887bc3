"""`export_c`: the digits MLP and convnet, trained a few steps, exported, built with the system
gcc under `-Wall -Wextra -Werror`, run on inputs from a file: the outputs are einjit's bit for bit
(the library is compiled with the C backend's flags); `nm` shows only the documented API."""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

import einjit as ej
from digits_models import build, images, run_main, trained
from einjit import fit, train
from einjit.backends.cc import openmp_env
from einjit.export import ExportError, export_c

pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("nm") is None,
                                reason="needs make and nm (binutils)")

API = {"create", "run", "destroy", "last_error"}
#: What the library may leave undefined: libc's memory, string and stdio calls, libm, OpenMP.
LIBC = {"calloc", "malloc", "free", "abort", "memcpy", "memset", "memmove", "snprintf", "strstr", "strchr", "strlen",
        "strncmp", "strtoll", "strtoull", "fopen", "fclose", "fread", "fseek", "ftell"}


def _symbols(lib) -> tuple[set[str], set[str]]:
    out = subprocess.run(["nm", "-g", str(lib)], capture_output=True, text=True, check=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "U":
            undefined.add(parts[1])
        elif len(parts) == 3:
            defined.add(parts[2])
    return defined, undefined


def _check_symbols(directory, name: str) -> set[str]:
    """The library defines only the API; what it leaves undefined is libc's, libm's, OpenMP's
    or libmvec's (`_ZGV...`, returned)."""
    defined, undefined = _symbols(directory / f"lib{name}.a")
    assert defined == {f"{name}_{f}" for f in API}
    libm = {s for s in undefined if re.fullmatch(r"(exp|log|sqrt|tanh|erf|pow|fmax|fmin|fabs|sin|cos)f?", s)}
    openmp = {s for s in undefined if s.startswith(("GOMP_", "omp_"))}
    libmvec = {s for s in undefined if s.startswith("_ZGV")}
    assert undefined - libm - openmp - libmvec <= LIBC, undefined - libm - openmp - libmvec - LIBC
    return libmvec


@pytest.mark.parametrize("kind", ["mlp", "convnet"])
@pytest.mark.parametrize("weights", ["embed", "file"])
def test_exported_model_matches_einjit(tmp_path, kind, weights):
    model = trained(kind)
    batch = 4
    step = fit.predictor(model, batch_dims=[batch], output_dims=[1, 8, 8])
    lib = export_c(step, tmp_path / "lib", name=f"digits_{kind}", weights=weights)
    build(lib.directory)
    _check_symbols(lib.directory, lib.name)
    xs, _ = images(3 * batch, seed=1)
    got = run_main(lib.directory, xs, batch * 10)
    want = np.stack([step(xs[k * batch:(k + 1) * batch]).reshape(-1) for k in range(3)])
    np.testing.assert_array_equal(got, want)
    assert np.abs(want).max() > 0.1  # a trained model's logits, not zeros
    assert (lib.weights_file is not None) == (weights == "file")


def test_export_is_byte_stable(tmp_path):
    """The same step exported twice, and the same model built and trained again from scratch
    after unrelated tensors (other tensor ids, other node ids): the same bytes, every file."""
    from einjit import shape as sh
    from einjit.tensor import random as rnd
    model = trained("mlp", steps=2)
    step = fit.predictor(model, batch_dims=[1], output_dims=[1, 8, 8])
    first = export_c(step, tmp_path / "a", name="mlp", weights="file")
    second = export_c(step, tmp_path / "b", name="mlp", weights="file")
    sh.reset_state()
    rnd.reset_streams()
    unrelated = [ej.relu(ej.input(f"other{k}", batch_dims=[3], output_dims=[2])) for k in range(5)]
    assert unrelated[-1].id > step.outputs[0].id
    rebuilt = fit.predictor(trained("mlp", steps=2), batch_dims=[1], output_dims=[1, 8, 8])
    third = export_c(rebuilt, tmp_path / "c", name="mlp", weights="file")
    for a, b, c in zip(first.files, second.files, third.files, strict=True):
        assert a.name == b.name == c.name and a.read_bytes() == b.read_bytes() == c.read_bytes(), a.name


def test_values_file_is_standard_safetensors(tmp_path):
    """The values file opens with the safetensors package, keyed by the parameters' labels."""
    st = pytest.importorskip("safetensors.numpy", reason="reading the file back needs the safetensors package")
    model = trained("mlp", steps=2)
    lib = export_c(fit.predictor(model, batch_dims=[1], output_dims=[1, 8, 8]), tmp_path / "lib", name="mlp",
                   weights="file")
    values = st.load_file(str(lib.weights_file))
    assert sorted(values) == sorted(p.label_str for p in model.params())
    for p in model.params():
        np.testing.assert_array_equal(values[p.label_str], p.numpy())


def _routine_body(source: str, header: str) -> str:
    """The body of the function whose definition starts with `header`, its loop iterators
    renumbered in order of appearance (the two lowerings number them apart)."""
    start = source.index("{", source.index(header))
    body = source[start:source.index("\n}\n", start)]
    names: dict[str, str] = {}
    return re.sub(r"\bi\d+\b", lambda m: names.setdefault(m.group(0), f"i{len(names)}"), body)


def test_exported_routine_is_the_code_einjit_runs(tmp_path, monkeypatch):
    """The routine in the library is the one einjit compiles and runs for the same step, line
    for line (scheduled, register-blocked, vectorized alike), up to the loop iterators' numbers."""
    from einjit import nn
    monkeypatch.setenv("EINJIT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("EINJIT_DEBUG", "3")  # the C backend keeps the sources it compiles
    monkeypatch.setenv("EINJIT_NUM_THREADS", "1")
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 120, label="fc1"), nn.ReLU(), nn.Linear(120, 10, label="fc2"))
    x = ej.input("images", batch_dims=[100], output_dims=[1, 8, 8])
    train.init_params(model(x), seed=0)
    step = fit.forward_step(model(x), inputs=[x], name="same_code")
    step(np.zeros((100, 1, 8, 8), np.float32))
    (compiled,) = [p for p in (tmp_path / "cache").rglob("*.c") if "void same_code(" in p.read_text()]
    lib = export_c(step, tmp_path / "lib", name="same")
    einjit_body = _routine_body(compiled.read_text(), "void same_code(")
    assert "register-blocked" in einjit_body
    assert _routine_body((lib.directory / "same.c").read_text(), "static void same_forward(") == einjit_body


def test_vector_math(tmp_path):
    """The log of a softmax over the GELU of 32 hidden units (exp and log in loops of 32, which
    gcc vectorizes): by default the library needs libc and libm only and matches einjit to
    1e-6; with vector_math=True it calls glibc's libmvec for the log as einjit does and matches
    it bit for bit. The exp is einjit's own either way (`c_math`), never a library call."""
    from einjit.backends.cc import toolchain
    if not toolchain.CcOptions(threads=1).effective_syntax().prelude:
        pytest.skip("libmvec is glibc's, on x86-64 Linux")
    model = trained("mlp", steps=2)
    x = ej.input("images", batch_dims=[16], output_dims=[1, 8, 8])
    hidden = ej.nn.Sequential(*model.layers[:2])(x)
    step = fit.forward_step(ej.log(ej.softmax(ej.gelu(hidden)), label="probs"), inputs=[x])
    xs, _ = images(16, seed=5)
    want = step(xs).reshape(1, -1)
    for vector_math in (False, True):
        lib = export_c(step, tmp_path / f"vm{vector_math}", name="probs", vector_math=vector_math)
        assert ("-lmvec" in (lib.directory / "Makefile").read_text()) == vector_math
        assert "einjit_expf(" in (lib.directory / "probs.c").read_text()
        build(lib.directory)
        vector_calls = _check_symbols(lib.directory, "probs")
        assert not any("exp" in s for s in vector_calls)
        got = run_main(lib.directory, xs, 16 * 32)
        if vector_math:
            assert vector_calls, "gcc vectorized no math call"
            np.testing.assert_array_equal(got, want)
        else:
            assert not vector_calls
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_makefile_uses_the_backends_flags(tmp_path):
    """The Makefile compiles with the C backend's flags: its optimization level and target CPU
    as OPT and ARCH, the rest as they are; the library, like einjit, contracts no a*b+c."""
    from einjit.backends.cc import toolchain
    model = trained("mlp", steps=1)
    lib = export_c(fit.predictor(model, batch_dims=[2], output_dims=[1, 8, 8]), tmp_path / "lib", name="mlp")
    text = (lib.directory / "Makefile").read_text()
    backend = [f for f in toolchain.CcOptions(threads=1).flags if f not in ("-fPIC", "-shared")]
    opt = next(f for f in backend if f.startswith("-O"))
    arch = next(f for f in backend if f.startswith("-march="))
    assert f"OPT ?= {opt}\n" in text and f"ARCH ?= {arch}\n" in text
    assert "EINJIT_FLAGS = $(OPT) $(ARCH) " + " ".join(f for f in backend if f not in (opt, arch)) + "\n" in text
    assert "-ffp-contract=off" in text and "-fopenmp" not in text


def test_model_with_input_dims_and_threads(tmp_path):
    """A model (not a step) with its input dims; two OpenMP threads: the same outputs."""
    model = trained("convnet", steps=2)
    lib = export_c(model, tmp_path / "lib", name="convnet", batch_dims=[2], output_dims=[1, 8, 8], threads=2)
    assert "-fopenmp" in (lib.directory / "Makefile").read_text()
    build(lib.directory)
    _check_symbols(lib.directory, "convnet")
    xs, _ = images(2, seed=2)
    got = run_main(lib.directory, xs, 20)
    want = fit.predictor(model, batch_dims=[2], output_dims=[1, 8, 8])(xs)
    np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-6, atol=1e-6)


def test_threads_run_large_contractions_on_openmp(tmp_path):
    """threads=2: a contraction large enough for threads runs under an OpenMP pragma (the header
    says so, the library calls libgomp) and computes what einjit computes; a small model
    exported for threads says in its header that it runs single-threaded."""
    x = ej.input("x", batch_dims=[128], output_dims=[256])
    w = ej.param("w", output_dims=[256], input_dims=[256])
    y = ej.relu(w @ x, label="y")
    train.init_params(y, seed=0)
    step = fit.forward_step(y, inputs=[x])
    lib = export_c(step, tmp_path / "big", name="big", threads=2, weights="file")
    header = (lib.directory / "big.h").read_text()
    assert "Parallel loops run on 2 OpenMP threads" in header
    assert f"GOMP_SPINCOUNT={openmp_env.SPIN_COUNT}" in header  # the policy einjit loads libgomp with
    assert "#pragma omp parallel" in (lib.directory / "big.c").read_text()
    build(lib.directory)
    _check_symbols(lib.directory, "big")
    assert any(s.startswith("GOMP_") for s in _symbols(lib.directory / "libbig.a")[1])
    xs = np.random.default_rng(6).standard_normal((128, 256)).astype(np.float32)
    got = run_main(lib.directory, xs[None], 128 * 256)
    np.testing.assert_allclose(got.reshape(128, 256), step(xs), rtol=1e-6, atol=1e-6)
    small = export_c(fit.predictor(trained("mlp", steps=1), batch_dims=[2], output_dims=[1, 8, 8]), tmp_path / "small",
                     name="small", threads=2)
    assert "runs single-threaded" in (small.directory / "small.h").read_text()


def test_swapped_values_file_and_bad_file(tmp_path):
    """New values in the safetensors file change the outputs without recompiling; a file that
    does not fit is refused by create with a message."""
    model = trained("mlp", steps=2)
    step = fit.predictor(model, batch_dims=[1], output_dims=[1, 8, 8])
    lib = export_c(step, tmp_path / "lib", name="mlp", weights="file")
    build(lib.directory)
    xs, _ = images(1, seed=3)
    before = run_main(lib.directory, xs, 10)
    fc2_b = next(p for p in model.params() if p.label_str == "fc2.b")
    fc2_b.set_values(fc2_b.numpy() + 1.0)
    ej.save(model.params(), lib.directory / "swapped.safetensors")
    after = run_main(lib.directory, xs, 10, "swapped.safetensors")
    np.testing.assert_allclose(after, before + 1.0, rtol=1e-6)
    (lib.directory / "bad.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{}              ")
    proc = subprocess.run(["./main", "in.bin", "out.bin", "bad.safetensors"], cwd=lib.directory,
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 1 and "values file lacks fc1.w" in proc.stderr


def test_output_names_and_refusals(tmp_path):
    x = ej.input("pixels", batch_dims=[2], output_dims=[3])
    w = ej.param("w", output_dims=[2], input_dims=[3])
    y = ej.relu(w @ x, label="scores")

    train.init_params(y, seed=0)
    lib = export_c(y, tmp_path / "lib", name="tiny", inputs=[x])
    assert [p.name for p in lib.inputs] == ["pixels"] and [p.name for p in lib.outputs] == ["scores"]
    header = (lib.directory / "tiny.h").read_text()
    assert "void tiny_run(tiny *model_, const float *pixels, float *scores);" in header
    assert "#define TINY_PIXELS_SIZE 6" in header
    with pytest.raises(ExportError, match="not a C identifier"):
        export_c(y, tmp_path / "x", name="my model", inputs=[x])
    with pytest.raises(ExportError, match="needs inputs"):
        export_c(y, tmp_path / "x", name="tiny")
    with pytest.raises(ExportError, match="weights must be"):
        export_c(y, tmp_path / "x", name="tiny", inputs=[x], weights="inline")


def test_labels_that_are_c_keywords_or_library_locals(tmp_path):
    """Inputs labelled `in` and `model`, an output labelled `int`: sanitized names that compile
    beside the library's and the example's own names."""
    a = ej.input("in", batch_dims=[2], output_dims=[3])
    b = ej.input("model", batch_dims=[2], output_dims=[3])
    y = ej.add(a, b, label="int")
    lib = export_c(y, tmp_path / "lib", name="kw", inputs=[a, b])
    assert [p.name for p in lib.inputs + lib.outputs] == ["in", "model", "int_"]
    build(lib.directory)
    xs = np.arange(12, dtype=np.float32).reshape(2, 6)
    records = np.concatenate([xs[:, :3].reshape(1, 6), xs[:, 3:].reshape(1, 6)], axis=1)
    got = run_main(lib.directory, records, 6)
    np.testing.assert_array_equal(got.reshape(2, 3), xs[:, :3] + xs[:, 3:])


def test_scratch_arrays_share_the_arena_einjit_plans(tmp_path):
    """The library's scratch arrays are views of one arena per instance at the offsets of the
    scratch plan einjit links the same step with: as many bytes as einjit's arena (fewer than
    one array each), and the outputs einjit's bit for bit (and ONNX Runtime's, where installed)."""
    model = trained("convnet")
    step = fit.predictor(model, batch_dims=[16], output_dims=[1, 8, 8])
    xs, _ = images(32, seed=3)
    want = np.concatenate([step(xs[:16]), step(xs[16:])])
    plan = step.routine.scratch_plan
    assert plan is not None and len(plan.offsets) >= 2 and plan.size < plan.parts_bytes
    lib = export_c(step, tmp_path / "lib", name="arena")
    assert lib.scratch_bytes == plan.size
    header = (lib.directory / "arena.h").read_text()
    assert f"#define ARENA_SCRATCH_BYTES {plan.size}\n" in header
    source = (lib.directory / "arena.c").read_text()
    views = re.findall(r"model_->\w+ = \(float \*\)\(model_->scratch_ \+ (\d+)\);", source)
    assert tuple(int(v) for v in views) == plan.offsets
    assert f"calloc({plan.size + 63}, 1)" in source
    build(lib.directory)
    got = run_main(lib.directory, xs, 16 * 10)
    np.testing.assert_array_equal(got.reshape(want.shape), want)
    assert np.abs(want).max() > 0.1
    try:
        import onnx  # noqa: F401  (export_onnx needs it)
        import onnxruntime
    except ImportError:
        return
    from einjit.export import export_onnx
    export_onnx(step, tmp_path / "arena.onnx")
    session = onnxruntime.InferenceSession(str(tmp_path / "arena.onnx"), providers=["CPUExecutionProvider"])
    ort = np.concatenate([session.run(None, {session.get_inputs()[0].name: xs[k:k + 16]})[0] for k in (0, 16)])
    np.testing.assert_allclose(got.reshape(want.shape), ort.reshape(want.shape), rtol=1e-5, atol=1e-5)


def test_scratch_plan_off_gives_the_library_one_array_each(tmp_path, monkeypatch):
    """With `EINJIT_SCRATCH_PLAN=0` the library's scratch arrays share no byte, as einjit's own
    arrays don't: each at its own offset, the arena their sum; the outputs are einjit's."""
    model = trained("convnet")
    step = fit.predictor(model, batch_dims=[16], output_dims=[1, 8, 8])
    xs, _ = images(16, seed=4)
    want = step(xs)
    shared = step.routine.scratch_plan
    assert shared is not None and shared.size < shared.parts_bytes
    monkeypatch.setenv("EINJIT_SCRATCH_PLAN", "0")
    lib = export_c(step, tmp_path / "lib", name="apart")
    source = (lib.directory / "apart.c").read_text()
    views = [int(v) for v in re.findall(r"model_->\w+ = \(float \*\)\(model_->scratch_ \+ (\d+)\);", source)]
    spans = sorted((o, o + -(-n // 64) * 64) for o, n in zip(views, shared.nbytes, strict=True))
    assert all(hi <= lo for (_, hi), (lo, _) in zip(spans, spans[1:], strict=False))
    assert lib.scratch_bytes == sum(hi - lo for lo, hi in spans) > shared.size
    build(lib.directory)
    got = run_main(lib.directory, xs, 16 * 10)
    np.testing.assert_array_equal(got.reshape(want.shape), want)


_BF16_PROGRAM = """\
#include <stdio.h>
#include "bfm.h"
#include "bfm.h" /* twice: the header is guarded */

int main(void) {
  static const float xs[BFM_X_SIZE] = {%s};
  static const float probes[] = {%s};
  einjit_bf16 x[BFM_X_SIZE], y[BFM_OUTPUT0_SIZE];
  for (int k = 0; k < BFM_X_SIZE; k++) x[k] = einjit_bf16_from_float(xs[k]);
  bfm *m = bfm_create();
  if (!m) return 1;
  bfm_run(m, x, y);
  bfm_destroy(m);
  for (int k = 0; k < BFM_OUTPUT0_SIZE; k++) printf("%%u %%.9g\\n", (unsigned)y[k], einjit_bf16_to_float(y[k]));
  for (unsigned k = 0; k < sizeof probes / sizeof probes[0]; k++)
    printf("%%u\\n", (unsigned)einjit_bf16_from_float(probes[k]));
  return 0;
}
"""


def test_bf16_ports_are_typed_and_converted_by_the_header(tmp_path):
    """A bf16 model's ports are `einjit_bf16` in the header, which also converts: a C program
    using only the header's type and conversions gets einjit's outputs bit for bit, and the
    header rounds floats as einjit does (ties to even, NaN, infinities)."""
    from einjit import nn
    from einjit.ir import bf16
    with ej.default_precision("bf16"):
        x = ej.input("x", batch_dims=[4], output_dims=[3], prec="bf16")
        y = nn.Linear(3, 2, label="fc")(x)
    train.init_params(y, seed=0)
    step = fit.forward_step(y, inputs=[x], name="bf16_step")
    xs = np.linspace(-1.3, 2.1, 12, dtype=np.float32).reshape(4, 3)
    want = bf16.to_bits(step(xs))  # the step returns float32 values, exactly bf16 numbers
    lib = export_c(step, tmp_path / "lib", name="bfm")
    assert [p.c_type for p in lib.inputs + lib.outputs] == ["einjit_bf16", "einjit_bf16"]
    header = (lib.directory / "bfm.h").read_text()
    assert "typedef unsigned short einjit_bf16;" in header
    assert "void bfm_run(bfm *model_, const einjit_bf16 *x, einjit_bf16 *output0);" in header
    build(lib.directory, "libbfm.a")
    probes = np.array([1.0, 1.00390625, 1.01171875, -2.5e-39, 3.4e38, np.inf, -np.inf, np.nan, 0.1], np.float32)
    literal = ", ".join(f"{v:.9e}f" for v in xs.reshape(-1))
    probe_text = ", ".join("NAN" if np.isnan(v) else "INFINITY" if v == np.inf else "-INFINITY" if v == -np.inf
                           else f"{v:.9e}f" for v in probes)
    (lib.directory / "prog.c").write_text("#include <math.h>\n" + _BF16_PROGRAM % (literal, probe_text))
    subprocess.run(["cc", "-std=c11", "-Wall", "-Wextra", "-Werror", "prog.c", "libbfm.a", "-lm", "-o", "prog"],
                   cwd=lib.directory, check=True)
    lines = subprocess.run(["./prog"], cwd=lib.directory, capture_output=True, text=True,
                           check=True).stdout.splitlines()
    outs = [line.split() for line in lines[:8]]
    np.testing.assert_array_equal(np.array([int(b) for b, _ in outs], np.uint16), want.reshape(-1))
    np.testing.assert_array_equal(np.array([float(f) for _, f in outs], np.float32),
                                  bf16.from_bits(want.reshape(-1)))
    assert np.abs(bf16.from_bits(want)).max() > 0.05
    np.testing.assert_array_equal(np.array([int(b) for b in lines[8:]], np.uint16), bf16.to_bits(probes))
