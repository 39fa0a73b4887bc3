"""`export_c`: a trained forward routine as a dependency-free C library in a directory.

The routine is lowered, optimized and rendered exactly as the C backend does for a forward
step (`lower_assignments`, `localize`, `render_program`); only the syntax differs: the routine
is `static` (the library's one global entry points are its documented API) and, unless
`vector_math=True`, glibc's libmvec vector math is left out (libc and libm are then the only
dependencies; loops calling log, tanh, pow... run scalar, with libm's correctly rounded
results rather than libmvec's few-ulp ones, so outputs of such models can differ from einjit's
in the last bits; `exp` in single precision is einjit's own inline function either way, the
same bits as einjit's). What einjit hands the routine as context arrays becomes, in the library:

- inputs and outputs: the caller's pointers, arguments of `NAME_run`;
- values the routine only reads (parameters, running statistics, constants): `static const`
  arrays in `NAME.c` (embedded), or read from `NAME.safetensors` by `NAME_create`, so new
  values can be swapped in without recompiling;
- values it reads and writes (state), and arrays it only writes (workspace): owned by the
  instance `NAME_create` returns, so instances are independent;
- the routine's scratch arrays (routine-local arrays too large for the stack): views into one
  arena per instance, at the offsets of einjit's own scratch plan (`backends/scratch_plan.py`),
  so the library needs the scratch bytes einjit needs (`NAME_SCRATCH_BYTES` in the header),
  and the barriers the plan puts where bytes pass between arrays guard the same code.

bf16 cells (precision bf16) are a float's upper 16 bits. The header names their C type
`einjit_bf16` (an `unsigned short`, so the library's code and the caller agree on the bits)
and defines `einjit_bf16_to_float` and `einjit_bf16_from_float`, the conversions einjit itself
renders (exact widening; rounding to nearest even, NaN kept a NaN), so a caller never handles
raw bit patterns by hand. bf16 values are embedded: the values file's reader checks the
safetensors dtypes that einjit's checkpoints write, and those have no bf16.

Everything written is a function of the model and its values (names come from labels, arrays
in the renderer's order), so exporting twice gives the same bytes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from einjit.backends import scratch_plan
from einjit.backends.c_syntax import C_SYNTAX, HELPERS, CSyntax, ParamKind, render_program
from einjit.backends.cc import openmp_env
from einjit.backends.cc import toolchain as cc
from einjit.backends.interface import lower_assignments, read_first
from einjit.backends.scratch_plan import ScratchPlan
from einjit.export.errors import ExportError
from einjit.ir import low_level as ll
from einjit.ir import ops
from einjit.ir.c_names import c_name
from einjit.ir.naming import stable_names
from einjit.ir.passes.local_storage import localize
from einjit.ir.tnode import Tnode
from einjit.tensor.tensor import Tensor
from einjit.training import checkpoint, fit

#: Values up to this many bytes are embedded as C arrays by `weights="auto"`; larger ones go to
#: a safetensors file (a C array literal takes about ten bytes of source per value).
EMBED_LIMIT_BYTES = 1 << 20

BF16_TYPE = "einjit_bf16"
"""The C type of bf16 cells in an exported library's API (see the module docstring)."""

_SAFETENSORS_DTYPES = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64", np.dtype(np.int32): "I32",
                       np.dtype(np.int64): "I64", np.dtype(np.uint8): "U8"}
_KEY = re.compile(r"[A-Za-z0-9_.\-]+\Z")


@dataclass(frozen=True)
class Port:
    """An input or output of the exported `run`: its C name, label, dims and C type."""

    name: str
    label: str
    dims: tuple[int, ...]
    c_type: str

    @property
    def size(self) -> int:
        return math.prod(self.dims)


@dataclass(frozen=True)
class CLibrary:
    """What `export_c` wrote: the directory, the files, and the `run` arguments in order."""

    directory: Path
    name: str
    inputs: tuple[Port, ...]
    outputs: tuple[Port, ...]
    files: tuple[Path, ...]
    weights_file: Path | None
    scratch_bytes: int = 0
    """The bytes of an instance's scratch arena (the scratch plan's size; 0 without scratch)."""


@dataclass(frozen=True)
class _Array:
    """One array parameter of the routine and its role in the library."""

    role: str
    tn: Tnode
    name: str
    key: str = ""
    offset: int = 0
    """Where a scratch array starts in the instance's arena (bytes)."""


def identifier(text: str, default: str) -> str:
    """`text` as a C identifier of `[A-Za-z0-9_]` (runs of other characters become one `_`),
    `default` when nothing is left; a C keyword or library name is mangled (`c_name`: `int_`).
    Names never end in `_` unless mangled, so the library's own locals, which do (`model_`),
    cannot collide with them."""
    clean = re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")
    if not clean:
        return default
    return c_name("n" + clean if clean[0].isdigit() else clean)


def _unique(names: list[str]) -> list[str]:
    """Repeated names get `_2`, `_3`... in order."""
    seen: dict[str, int] = {}
    out = []
    for n in names:
        seen[n] = seen.get(n, 0) + 1
        out.append(n if seen[n] == 1 else f"{n}_{seen[n]}")
    return out


def resolve_step(model: object, inputs: Sequence[Tensor] | None, batch_dims: Sequence[int],
                 input_dims: Sequence[int], output_dims: Sequence[int]) -> tuple[list[Tensor], list[Tensor]]:
    """The outputs and inputs of what is exported: a forward step (`fit.predictor`,
    `fit.forward_step`), output tensors with their `inputs`, or a model (an `nn` layer or an
    `@ej.op` function of one tensor) with the dims of its input."""
    if isinstance(model, fit.ForwardStep):
        return list(model.outputs), list(model.inputs)
    if isinstance(model, Tensor) or (isinstance(model, (list, tuple)) and model
                                     and all(isinstance(t, Tensor) for t in model)):
        if inputs is None:
            raise ExportError("einjit: exporting output tensors needs inputs=[...], the ej.input tensors they read")
        outs = [model] if isinstance(model, Tensor) else list(model)
        return outs, list(inputs)
    if callable(model):
        step = fit.predictor(model, batch_dims=batch_dims, input_dims=input_dims, output_dims=output_dims)
        return list(step.outputs), list(step.inputs)
    raise ExportError(f"einjit: cannot export a {type(model).__name__}: expected a forward step, output tensors "
                      f"with inputs=, or a model with its input dims")


def _written(llc: ll.LLStmt) -> set[Tnode]:
    return {s.tn for s in ll.iter_stmts(llc) if isinstance(s, (ll.Set, ll.SetFromVec, ll.ZeroOut))}


def _roles(params, inputs: list[Tensor], outputs: list[Tensor], lowered, plan: ScratchPlan | None) -> list[_Array]:
    """Each array parameter's role (see the module docstring), checked: an input the routine
    writes, or an output it reads before computing it, cannot be the caller's buffer. The
    k-th scratch parameter gets the plan's k-th offset."""
    by_in = {t.value_tn: t for t in inputs}
    by_out = {t.value_tn: t for t in outputs}
    first = read_first(lowered)
    written = _written(lowered.llc)
    offsets = iter(plan.offsets if plan is not None else ())
    arrays = []
    for p in params:
        match p.kind:
            case ParamKind.ARRAY if p.tn in by_in:
                if p.tn in written:
                    raise ExportError(f"einjit: export: the routine writes its input {by_in[p.tn].describe()}")
                arrays.append(_Array("input", p.tn, p.c_name))
            case ParamKind.ARRAY if p.tn in by_out:
                if p.tn in first:
                    raise ExportError(f"einjit: export: output {by_out[p.tn].describe()} is read before the routine "
                                      f"computes it (it accumulates into its old values); export a tensor computed "
                                      f"afresh")
                arrays.append(_Array("output", p.tn, p.c_name))
            case ParamKind.ARRAY if p.tn in first:
                arrays.append(_Array("state" if p.tn in written else "constant", p.tn, p.c_name))
            case ParamKind.SCRATCH:
                arrays.append(_Array("scratch", p.tn, p.c_name, offset=next(offsets)))
            case ParamKind.ARRAY:
                arrays.append(_Array("workspace", p.tn, p.c_name))
            case _:
                raise ExportError(f"einjit: export: the forward routine has a {p.kind.value} parameter "
                                  f"{p.c_name!r}; only array parameters can be exported")
    missing = [t.describe() for t in outputs if t.value_tn not in {a.tn for a in arrays}]
    if missing:
        raise ExportError(f"einjit: export: outputs {missing} are not computed by the forward routine "
                          f"(a parameter or an input itself?)")
    return arrays


def _values(arrays: list[_Array]) -> dict[Tnode, np.ndarray]:
    out = {}
    for a in arrays:
        if a.role in ("constant", "state"):
            if a.tn.array is None:
                raise ExportError(f"einjit: export: {a.tn.debug_name()} has no values: initialize the parameters "
                                  f"(train.init_params) or load a checkpoint first")
            arr = np.ascontiguousarray(a.tn.array)
            if arr.dtype not in _SAFETENSORS_DTYPES and a.tn.prec is not ops.bf16:
                raise ExportError(f"einjit: export: {a.tn.debug_name()} has dtype {arr.dtype}; the C export "
                                  f"supports {sorted(str(d) for d in _SAFETENSORS_DTYPES)}")
            out[a.tn] = arr
    return out


def _literal(v: np.floating | np.integer) -> str:
    if v.dtype.kind != "f":
        return str(int(v)) + ("LL" if v.dtype.itemsize == 8 else "")
    if math.isnan(v):
        return "NAN"
    if math.isinf(v):
        return "INFINITY" if float(v) > 0 else "-INFINITY"
    text = str(v)
    return text + "f" if v.dtype == np.float32 else text


def _array_literal(arr: np.ndarray, per_line: int = 8) -> str:
    items = [_literal(v) for v in arr.reshape(-1)]
    rows = [", ".join(items[k:k + per_line]) for k in range(0, len(items), per_line)]
    return "  " + ",\n  ".join(rows)


def _c_type(tn: Tnode) -> str:
    return BF16_TYPE if tn.prec is ops.bf16 else C_SYNTAX.type_name(tn.prec)


def _port(t: Tensor, name: str) -> Port:
    return Port(name, t.label_str, tuple(t.value_tn.dims), _c_type(t.value_tn))


def export_c(model: object, directory: str | Path, *, name: str = "model", inputs: Sequence[Tensor] | None = None,
             batch_dims: Sequence[int] = (1,), input_dims: Sequence[int] = (), output_dims: Sequence[int] = (1,),
             weights: str = "auto", threads: int = 1, vector_math: bool = False) -> CLibrary:
    """Write `model`'s forward routine as a C library into `directory` (created if needed):
    `NAME.h` (the documented API), `NAME.c`, `Makefile`, an example `main.c`, and with
    `weights="file"` (or `"auto"` past `EMBED_LIMIT_BYTES`) `NAME.safetensors`.

    `model` is a forward step (`fit.predictor(...)`, `fit.forward_step(...)`), output tensors
    with `inputs=[...]`, or a model (an `nn` layer, an `@ej.op` function) whose input has
    `batch_dims`/`input_dims`/`output_dims`. The batch size is fixed at export. `threads > 1`
    runs the routine's parallel loops on OpenMP threads (then the library needs `-fopenmp`).
    `vector_math=True` vectorizes math calls with glibc's libmvec as einjit does (x86-64 glibc;
    the library then links `-lmvec`, and computes what einjit computes bit for bit).
    Layers with a train/eval mode are exported in the mode they are in: call `model.eval()`
    first for inference.
    """
    if weights not in ("auto", "embed", "file"):
        raise ExportError(f"einjit: export_c: weights must be 'auto', 'embed' or 'file', got {weights!r}")
    if not isinstance(threads, int) or threads < 1:
        raise ExportError(f"einjit: export_c: threads must be a positive integer, got {threads!r}")
    prefix = identifier(name, "model")
    if prefix != name:
        raise ExportError(f"einjit: export_c: name {name!r} is not a C identifier (letters, digits, _), "
                          f"e.g. {prefix!r}")
    outputs, ins = resolve_step(model, inputs, batch_dims, input_dims, output_dims)
    for t in ins:
        if t.op_label != "input":
            raise ExportError(f"einjit: export_c: {t.describe()} is not an ej.input tensor")
    syntax = _syntax(threads, vector_math)
    routine = f"{prefix}_forward"
    with stable_names():
        _, lowered = lower_assignments((), fit.forward_code(*outputs), routine)
        localize([(routine, lowered, read_first(lowered))])
        # the code einjit runs: scratch zeroing at first use, its arena's plan and barriers
        llc, plan = scratch_plan.place(lowered.llc, syntax)
        first = render_program([(routine, llc)], (), syntax)
        arrays = _roles(first.routines[0].params, ins, outputs, lowered, plan)
        in_names = _unique([identifier(t.label_str, f"input{k}") for k, t in enumerate(ins)])
        out_names = _unique([identifier(t.label_str, f"output{k}") for k, t in enumerate(outputs)])
        arrays = _named(arrays, ins, outputs, in_names, out_names, prefix)
        values = _values(arrays)
        total = sum(v.nbytes for v in values.values())
        bf16 = [a.tn.debug_name() for a in arrays if a.tn in values and a.tn.prec is ops.bf16]
        embed = weights == "embed" or (weights == "auto" and (total <= EMBED_LIMIT_BYTES or bool(bf16)))
        if bf16 and not embed:
            raise ExportError(f"einjit: export_c: bf16 values {bf16} can only be embedded (weights='embed'): "
                              f"safetensors files of einjit hold no bf16")
        prelude = syntax.prelude + _prelude(prefix, arrays, values, embed)
        program = render_program([(routine, llc)], (), replace(syntax, prelude=prelude))
    in_ports = tuple(_port(t, n) for t, n in zip(ins, in_names, strict=True))
    out_ports = tuple(_port(t, n) for t, n in zip(outputs, out_names, strict=True))
    scratch_bytes = 0 if plan is None else plan.size
    source = _source_head(prefix) + program.source + "\n" + _api(prefix, routine, arrays, in_ports, out_ports,
                                                                 values, embed, scratch_bytes)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    parallel = "#pragma omp" in program.source
    files = {f"{prefix}.h": _header(prefix, in_ports, out_ports, arrays, embed, threads, vector_math, parallel,
                                    scratch_bytes),
             f"{prefix}.c": source, "main.c": _main(prefix, in_ports, out_ports, embed),
             "Makefile": _makefile(prefix, threads, vector_math)}
    written = []
    for fname, text in files.items():
        path = directory / fname
        path.write_text(text, encoding="utf-8")
        written.append(path)
    weights_file = None
    if not embed:
        weights_file = directory / f"{prefix}.safetensors"
        checkpoint.write({a.key: values[a.tn] for a in arrays if a.tn in values}, weights_file)
        written.append(weights_file)
    return CLibrary(directory, prefix, in_ports, out_ports, tuple(written), weights_file, scratch_bytes)


def _syntax(threads: int, vector_math: bool) -> CSyntax:
    """The C backend's syntax for `threads` threads (whatever it adds, the library gets),
    without outlining (one routine), with the routine `static` and the library's includes."""
    def backend(vector: bool) -> CSyntax:
        return cc.CcOptions(threads=threads, vector_math=vector, outline_min_nests=0).effective_syntax()

    syntax = backend(vector_math)
    if vector_math and syntax.prelude == backend(False).prelude:
        raise ExportError("einjit: export_c: vector_math=True needs glibc's libmvec (x86-64 Linux with glibc)")
    includes = tuple(sorted({*syntax.includes, "math.h", "stdint.h", "stdio.h", "stdlib.h", "string.h"}))
    return replace(syntax, function_qualifier="static", includes=includes)


def _named(arrays: list[_Array], ins: list[Tensor], outs: list[Tensor], in_names: list[str], out_names: list[str],
           prefix: str) -> list[_Array]:
    """Names in the library: inputs and outputs by their `run` argument names; the others as
    `prefix_label` (static arrays and instance fields), with their safetensors key (the label
    as checkpoints write it, when it needs no JSON escapes)."""
    port = {t.value_tn: n for t, n in zip(ins + outs, in_names + out_names, strict=True)}
    others = [a for a in arrays if a.role not in ("input", "output")]
    base = _unique([identifier(".".join(a.tn.label), "array") for a in others])
    named = dict(zip([id(a) for a in others], base, strict=True))
    out = []
    for a in arrays:
        if a.role in ("input", "output"):
            out.append(replace(a, name=port[a.tn]))
            continue
        label = ".".join(a.tn.label)
        field = named[id(a)]
        key = label if _KEY.match(label) and label.count(".") + 1 == len(a.tn.label) else field
        out.append(replace(a, name=f"{prefix}_{field}" if a.role == "constant" else field, key=key))
    keys = [a.key for a in out if a.key]
    if len(set(keys)) != len(keys):
        out = [replace(a, key=a.name) if a.key else a for a in out]
    return out


# ---------------------------------------------------------------- C text


def _source_head(prefix: str) -> str:
    return (f"/* {prefix}.c: the einjit model {prefix!r} as a C library (API in {prefix}.h).\n"
            f" * Generated by einjit.export.export_c: the forward routine as einjit compiles it. */\n")


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _prelude(prefix: str, arrays: list[_Array], values: dict[Tnode, np.ndarray], embed: bool) -> str:
    lines = [f'#include "{prefix}.h"', ""]
    for a in arrays:
        if a.tn not in values or not embed:
            continue
        what = "initial values of the state" if a.role == "state" else "values"
        name = a.name if a.role == "constant" else f"{prefix}_{a.name}_init"
        lines += [f"/* {a.tn.debug_name().split('#')[0]}: {what}, dims {_dims_text(a.tn.dims)}. */",
                  f"static const {_c_type(a.tn)} {name}[{a.tn.size}] = {{", _array_literal(values[a.tn]), "};", ""]
    return "\n".join(lines)


def _fields(arrays: list[_Array], embed: bool) -> list[_Array]:
    """The arrays an instance owns: state and workspace, and the values when read from a file."""
    return [a for a in arrays if a.role in ("state", "workspace") or (a.role == "constant" and not embed)]


def _api(prefix: str, routine: str, arrays: list[_Array], ins: tuple[Port, ...], outs: tuple[Port, ...],
         values: dict[Tnode, np.ndarray], embed: bool, scratch_bytes: int) -> str:
    fields = _fields(arrays, embed)
    scratch = [a for a in arrays if a.role == "scratch"]
    parts = [f"struct {prefix} {{"]
    parts += [f"  {_c_type(a.tn)} *{a.name};  /* {a.role}: {'.'.join(a.tn.label)} {_dims_text(a.tn.dims)} */"
              for a in fields]
    parts += [f"  {_c_type(a.tn)} *{a.name};  /* scratch: {'.'.join(a.tn.label)} {_dims_text(a.tn.dims)}, at byte "
              f"{a.offset} of the arena */" for a in scratch]
    if scratch:
        parts += [f"  unsigned char *scratch_;  /* the scratch arena: {len(scratch)} arrays in {scratch_bytes} bytes "
                  f"({sum(a.tn.size * a.tn.prec.itemsize for a in scratch)} one array each) */",
                  f"  unsigned char *scratch_raw_;  /* scratch_ as allocated, before {scratch_plan.ALIGN}-byte "
                  f"alignment */"]
    if not fields and not scratch:
        parts.append("  int unused;  /* the model keeps no arrays between calls */")
    parts += ["};", "", f"static char {prefix}_error_text[256];", ""]
    parts += [f"const char *{prefix}_last_error(void) {{", f"  return {prefix}_error_text;", "}", ""]
    parts += [f"static void *{prefix}_fail(const char *what, const char *detail) {{",
              f"  snprintf({prefix}_error_text, sizeof {prefix}_error_text, \"%s%s\", what, detail);",
              "  return NULL;", "}", ""]
    parts += [f"void {prefix}_destroy({prefix} *model_) {{", "  if (!model_) return;"]
    parts += [f"  free(model_->{a.name});" for a in fields]
    if scratch:
        parts.append("  free(model_->scratch_raw_);")
    parts += ["  free(model_);", "}", ""]
    if not embed:
        parts += [_reader(prefix), _loader(prefix, arrays, values)]
    head = f"{prefix} *{prefix}_create(void)" if embed else f"{prefix} *{prefix}_create(const char *weights_path)"
    parts += [head + " {", f"  {prefix} *model_ = ({prefix} *)calloc(1, sizeof *model_);",
              f"  if (!model_) return ({prefix} *){prefix}_fail(\"out of memory\", \"\");"]
    for a in fields:
        parts += [f"  model_->{a.name} = ({_c_type(a.tn)} *)calloc({a.tn.size}, sizeof *model_->{a.name});",
                  f"  if (!model_->{a.name}) {{ {prefix}_destroy(model_); return ({prefix} *){prefix}_fail(\"out of "
                  f"memory for \", \"{a.name}\"); }}"]
    if scratch:
        align = scratch_plan.ALIGN
        parts += [f"  model_->scratch_raw_ = (unsigned char *)calloc({scratch_bytes + align - 1}, 1);",
                  f"  if (!model_->scratch_raw_) {{ {prefix}_destroy(model_); return ({prefix} *){prefix}_fail(\"out "
                  f"of memory for \", \"the scratch arena\"); }}",
                  f"  model_->scratch_ = model_->scratch_raw_ + (-(uintptr_t)model_->scratch_raw_ & {align - 1});"]
        parts += [f"  model_->{a.name} = ({_c_type(a.tn)} *)(model_->scratch_ + {a.offset});" for a in scratch]
    if embed:
        parts += [f"  memcpy(model_->{a.name}, {prefix}_{a.name}_init, sizeof {prefix}_{a.name}_init);"
                  for a in fields if a.role == "state"]
    else:
        parts += ["  if (!weights_path) { " + f"{prefix}_destroy(model_); return ({prefix} *){prefix}_fail(\"no "
                  "weights file given\", \"\"); }",
                  f"  if ({prefix}_load(model_, weights_path) != 0) {{ {prefix}_destroy(model_); return NULL; }}"]
    parts += ["  return model_;", "}", ""]
    args = ", ".join([f"const {p.c_type} *{p.name}" for p in ins] + [f"{p.c_type} *{p.name}" for p in outs])
    parts += [f"void {prefix}_run({prefix} *model_, {args}) {{"]
    used = {a.name for a in arrays if a.role in ("input", "output")}
    parts += [f"  (void){p.name};" for p in ins if p.name not in used]
    if not fields and not scratch:
        parts.append("  (void)model_;")
    call = [a.name if a.role in ("input", "output") or (a.role == "constant" and embed) else f"model_->{a.name}"
            for a in arrays]
    parts += [f"  {routine}({', '.join(call)});", "}", ""]
    return "\n".join(parts)


def _reader(prefix: str) -> str:
    """The safetensors reader of file mode: the file is read whole, each value located by its
    key in the JSON header, its dtype, shape and byte range checked, then copied."""
    p = prefix
    return f"""\
/* The values file: safetensors (an 8-byte little-endian header length, a JSON header
 * {{"key": {{"dtype": ..., "shape": [...], "data_offsets": [begin, end]}}}}, then the data). */
static const char *{p}_after(const char *at, const char *key, const char *end) {{
  const char *found = strstr(at, key);
  if (!found || found >= end) return NULL;
  found += strlen(key);
  while (*found == ' ' || *found == ':') found++;
  return found;
}}

static int {p}_value(const char *header, const unsigned char *data, unsigned long long data_size, const char *key,
                     const char *dtype, const long long *shape, int rank, void *dst, unsigned long long nbytes) {{
  char quoted[256];
  char expected[32];
  snprintf(quoted, sizeof quoted, "\\"%s\\"", key);
  const char *entry = header;
  for (;;) {{
    entry = strstr(entry, quoted);
    if (!entry) {{ {p}_fail("values file lacks ", key); return -1; }}
    entry += strlen(quoted);
    while (*entry == ' ') entry++;
    if (*entry == ':') break;
  }}
  const char *end = strchr(entry, '}}');
  const char *at = end ? {p}_after(entry, "\\"dtype\\"", end) : NULL;
  snprintf(expected, sizeof expected, "\\"%s\\"", dtype);
  if (!at || strncmp(at, expected, strlen(expected)) != 0) {{ {p}_fail("wrong dtype for ", key); return -1; }}
  at = {p}_after(entry, "\\"shape\\"", end);
  if (!at || *at != '[') {{ {p}_fail("no shape for ", key); return -1; }}
  at++;
  for (int k = 0; k < rank; k++) {{
    char *next;
    long long d = strtoll(at, &next, 10);
    if (next == at || d != shape[k]) {{ {p}_fail("wrong shape for ", key); return -1; }}
    at = next;
    while (*at == ' ' || *at == ',') at++;
  }}
  if (*at != ']') {{ {p}_fail("wrong shape for ", key); return -1; }}
  at = {p}_after(entry, "\\"data_offsets\\"", end);
  if (!at || *at != '[') {{ {p}_fail("no data offsets for ", key); return -1; }}
  char *next;
  unsigned long long begin = strtoull(at + 1, &next, 10);
  while (*next == ' ' || *next == ',') next++;
  unsigned long long stop = strtoull(next, &next, 10);
  if (begin > stop || stop > data_size || stop - begin != nbytes) {{
    {p}_fail("wrong byte range for ", key);
    return -1;
  }}
  memcpy(dst, data + begin, nbytes);
  return 0;
}}

static int {p}_load_values({p} *model_, const char *header, const unsigned char *data,
                           unsigned long long data_size);

static int {p}_load({p} *model_, const char *path) {{
  const uint16_t probe = 1;
  if (*(const unsigned char *)&probe != 1) {{
    {p}_fail("safetensors data is little-endian; this host is not", "");
    return -1;
  }}
  FILE *f = fopen(path, "rb");
  if (!f) {{ {p}_fail("cannot open values file ", path); return -1; }}
  unsigned char len[8];
  int status = -1;
  char *header = NULL;
  unsigned char *data = NULL;
  if (fread(len, 1, 8, f) != 8) {{ {p}_fail("values file too short: ", path); goto done; }}
  unsigned long long n = 0;
  for (int k = 7; k >= 0; k--) n = (n << 8) | len[k];
  if (fseek(f, 0, SEEK_END) != 0) {{ {p}_fail("cannot seek in ", path); goto done; }}
  long size = ftell(f);
  if (size < 8 || n > (unsigned long long)size - 8) {{ {p}_fail("corrupted header length in ", path); goto done; }}
  unsigned long long data_size = (unsigned long long)size - 8 - n;
  header = (char *)malloc(n + 1);
  data = (unsigned char *)malloc(data_size ? data_size : 1);
  if (!header || !data) {{ {p}_fail("out of memory reading ", path); goto done; }}
  if (fseek(f, 8, SEEK_SET) != 0 || fread(header, 1, n, f) != n || fread(data, 1, data_size, f) != data_size) {{
    {p}_fail("cannot read ", path);
    goto done;
  }}
  header[n] = '\\0';
  status = {p}_load_values(model_, header, data, data_size);
done:
  free(header);
  free(data);
  fclose(f);
  return status;
}}
"""


def _loader(prefix: str, arrays: list[_Array], values: dict[Tnode, np.ndarray]) -> str:
    lines = [f"static int {prefix}_load_values({prefix} *model_, const char *header, const unsigned char *data, "
             f"unsigned long long data_size) {{"]
    for a in arrays:
        if a.tn not in values:
            continue
        arr = values[a.tn]
        shape = ", ".join(f"{d}LL" for d in arr.shape) or "0LL"
        lines += ["  {", f"    static const long long shape[] = {{{shape}}};",
                  f"    if ({prefix}_value(header, data, data_size, \"{a.key}\", \"{_SAFETENSORS_DTYPES[arr.dtype]}\", "
                  f"shape, {arr.ndim}, model_->{a.name}, {arr.nbytes}ULL) != 0) return -1;", "  }"]
    lines += ["  return 0;", "}", ""]
    return "\n".join(lines)


def _header(prefix: str, ins: tuple[Port, ...], outs: tuple[Port, ...], arrays: list[_Array], embed: bool,
            threads: int, vector_math: bool, parallel: bool, scratch_bytes: int) -> str:
    guard = prefix.upper() + "_H"
    ports = [f" *   {p.name}: {p.c_type} {_dims_text(p.dims)}, {p.size} values (label {p.label!r})" for p in ins]
    out_ports = [f" *   {p.name}: {p.c_type} {_dims_text(p.dims)}, {p.size} values (label {p.label!r})"
                 for p in outs]
    keys = [f" *   {a.key}: {_c_type(a.tn)} {_dims_text(a.tn.dims)}" for a in arrays
            if a.role in ("constant", "state")]
    if embed:
        values = [" * The trained values are embedded in " + prefix + ".c."]
        create = f"{prefix} *{prefix}_create(void);"
        usage = f"{prefix}_create()"
    else:
        values = [f" * The trained values are read by {prefix}_create from a safetensors file ({prefix}.safetensors as",
                  " * exported; another file with the same keys, dtypes and shapes can replace it):", *keys]
        create = f"{prefix} *{prefix}_create(const char *weights_path);"
        usage = f"{prefix}_create(\"{prefix}.safetensors\")"
    args = ", ".join([f"const {p.c_type} *{p.name}" for p in ins] + [f"{p.c_type} *{p.name}" for p in outs])
    names = ", ".join(p.name for p in ins + outs)
    libs = "libc, libm and glibc's libmvec (link with -lmvec)" if vector_math else "libc and libm"
    if threads > 1 and parallel:
        threads_text = "\n".join([
            f" * Parallel loops run on {threads} OpenMP threads (link with -fopenmp); needs {libs}.",
            f" * With libgomp, set GOMP_SPINCOUNT={openmp_env.SPIN_COUNT} where the program starts: idle threads then",
            " * sleep after ~30 us, so a busy machine's other processes get the core (einjit's own calls",
            " * run on its thread team instead, which spins only while the machine is quiet)."])
    elif threads > 1:
        threads_text = (f" * Exported for {threads} OpenMP threads, but no loop of this model is large enough to\n"
                        f" * pay for them: it runs single-threaded; needs {libs}.")
    else:
        threads_text = f" * Single-threaded; no dependency beyond {libs}."
    bf16 = any(p.c_type == BF16_TYPE for p in ins + outs) or any(a.tn.prec is ops.bf16 for a in arrays)
    macros = [f"#define {prefix.upper()}_{p.name.upper()}_SIZE {p.size}" for p in ins + outs]
    macros.append(f"#define {prefix.upper()}_SCRATCH_BYTES {scratch_bytes}")
    return "\n".join([
        f"/* {prefix}.h: the C API of the einjit model {prefix!r} (generated by einjit.export.export_c).",
        " *",
        " * Arrays are dense, row-major (C order), batch axes first; the batch size is fixed at export.",
        *([f" * {BF16_TYPE} is a bfloat16 number as its 16 bits (a float's upper half): convert with",
           " * einjit_bf16_from_float (rounds to nearest even) and einjit_bf16_to_float (exact)."] if bf16 else []),
        " * Inputs:", *ports, " * Outputs:", *out_ports,
        *values,
        threads_text,
        " *",
        " * Usage:",
        f" *   {prefix} *m = {usage};   (NULL on failure: {prefix}_last_error() says why)",
        f" *   {prefix}_run(m, {names});",
        f" *   {prefix}_destroy(m);",
        " *",
        " * An instance owns the arrays the model keeps between and within calls: distinct instances may",
        " * run concurrently, one instance runs one call at a time. Input and output buffers must not overlap.",
        *([f" * Its temporary arrays share one scratch arena of {prefix.upper()}_SCRATCH_BYTES bytes, placed as",
           " * einjit places them (arrays that are never needed at the same time share bytes)."]
          if scratch_bytes else []),
        " */",
        f"#ifndef {guard}",
        f"#define {guard}",
        "",
        "#ifdef __cplusplus",
        'extern "C" {',
        "#endif",
        "",
        *(_bf16_api() if bf16 else []),
        *macros,
        "",
        f"typedef struct {prefix} {prefix};",
        "",
        "/* A new instance, or NULL (out of memory, or a values file that cannot be read or does not fit). */",
        create,
        "",
        "/* Compute the outputs from the inputs. */",
        f"void {prefix}_run({prefix} *model_, {args});",
        "",
        "/* Free an instance (NULL is ignored). */",
        f"void {prefix}_destroy({prefix} *model_);",
        "",
        f"/* Why the last {prefix}_create of this process failed (not thread-safe). */",
        f"const char *{prefix}_last_error(void);",
        "",
        "#ifdef __cplusplus",
        "}",
        "#endif",
        "",
        f"#endif /* {guard} */",
        ""])


def _bf16_api() -> list[str]:
    """`einjit_bf16` and its conversions for the header: the helpers einjit renders into its
    own code (`c_syntax.HELPERS["bf16"]`) under public names, guarded so that the headers of
    two exported models can be included together."""
    public = HELPERS["bf16"].format(q="static inline")
    for old, new in (("float einjit_bf16_load(unsigned short h)", f"float einjit_bf16_to_float({BF16_TYPE} h)"),
                     ("unsigned short einjit_bf16_store(float f)", f"{BF16_TYPE} einjit_bf16_from_float(float f)")):
        if old not in public:
            raise ExportError(f"einjit: export_c: the C backend's bf16 helpers no longer define {old!r}")
        public = public.replace(old, new)
    return ["#ifndef EINJIT_BF16_DEFINED", "#define EINJIT_BF16_DEFINED",
            f"typedef {C_SYNTAX.type_name(ops.bf16)} {BF16_TYPE};", public.rstrip("\n"), "#endif", ""]


def _main(prefix: str, ins: tuple[Port, ...], outs: tuple[Port, ...], embed: bool) -> str:
    """An example program: raw native-endian records in, raw records out, one `run` per record."""
    create_arg = "" if embed else f'argc > 3 ? argv[3] : "{prefix}.safetensors"'
    in_sizes = " + ".join(f"{prefix.upper()}_{p.name.upper()}_SIZE * sizeof({p.c_type})" for p in ins) or "0"
    lines = [
        f"/* main.c: run the einjit model {prefix!r} on inputs from a file, write the outputs to a file.",
        " *",
        f" *   ./main INPUT OUTPUT{'' if embed else ' [WEIGHTS]'}",
        " *",
        " * INPUT holds records of raw values in the host's byte order (NumPy: array.tofile), each record",
        (" * one call's inputs one after the other: " + ", ".join(f"{p.name} ({p.size} {p.c_type})" for p in ins) + "."
         if ins else " * (the model has no inputs: INPUT is not read, and the program makes one call)."),
        " * OUTPUT receives one record per input record: " + ", ".join(f"{p.name} ({p.size} {p.c_type})"
                                                                        for p in outs) + ".",
        " */",
        "#include <stdio.h>",
        "#include <stdlib.h>",
        "",
        f'#include "{prefix}.h"',
        "",
        "int main(int argc, char **argv) {",
        f"  if (argc < 3 || argc > {3 if embed else 4}) {{",
        f"    fprintf(stderr, \"usage: %s INPUT OUTPUT{'' if embed else ' [WEIGHTS]'}\\n\", argv[0]);",
        "    return 2;",
        "  }",
        f"  {prefix} *model_ = {prefix}_create({create_arg});",
        "  if (!model_) {",
        f"    fprintf(stderr, \"%s: %s\\n\", argv[0], {prefix}_last_error());",
        "    return 1;",
        "  }",
        "  FILE *input_file_ = fopen(argv[1], \"rb\");",
        "  FILE *output_file_ = fopen(argv[2], \"wb\");",
        "  if (!input_file_ || !output_file_) {",
        "    fprintf(stderr, \"%s: cannot open %s\\n\", argv[0], !input_file_ ? argv[1] : argv[2]);",
        "    return 1;",
        "  }",
    ]
    for p in ins + outs:
        lines.append(f"  static {p.c_type} {p.name}_values_[{prefix.upper()}_{p.name.upper()}_SIZE];")
    lines += ["  long records_ = 0;", "  for (;;) {"]
    for k, p in enumerate(ins):
        size = f"{prefix.upper()}_{p.name.upper()}_SIZE"
        lines.append(f"    size_t {p.name}_got_ = fread({p.name}_values_, sizeof({p.c_type}), {size}, input_file_);")
        if k == 0:
            lines += [f"    if ({p.name}_got_ == 0) break;"]
        lines += [f"    if ({p.name}_got_ != {size}) {{",
                  f"      fprintf(stderr, \"%s: record %ld of %s is incomplete (a record is %zu bytes)\\n\", "
                  f"argv[0], records_, argv[1], (size_t)({in_sizes}));",
                  "      return 1;", "    }"]
    call = ", ".join(f"{p.name}_values_" for p in ins + outs)
    lines.append(f"    {prefix}_run(model_, {call});")
    for p in outs:
        size = f"{prefix.upper()}_{p.name.upper()}_SIZE"
        lines += [f"    if (fwrite({p.name}_values_, sizeof({p.c_type}), {size}, output_file_) != {size}) {{",
                  "      fprintf(stderr, \"%s: cannot write %s\\n\", argv[0], argv[2]);", "      return 1;", "    }"]
    if not ins:
        lines.append("    break; /* no inputs: one call */")
    lines += ["    records_++;", "  }", "  fclose(input_file_);", "  if (fclose(output_file_) != 0) {",
              "    fprintf(stderr, \"%s: cannot write %s\\n\", argv[0], argv[2]);", "    return 1;", "  }",
              f"  {prefix}_destroy(model_);", "  return 0;", "}", ""]
    return "\n".join(lines)


def compile_flags(threads: int = 1) -> tuple[str, ...]:
    """The C backend's code-generation flags for a static library (no `-fPIC -shared`): the
    exported code then computes bit for bit what einjit computes."""
    flags = tuple(f for f in cc.CcOptions(threads=1, vector_math=False).flags if f not in ("-fPIC", "-shared"))
    return flags + (("-fopenmp",) if threads > 1 else ())


def _makefile(prefix: str, threads: int, vector_math: bool) -> str:
    """The C backend's flags, its optimization level and target CPU as the variables OPT and
    ARCH (so a build for another CPU changes one variable, and a backend that changes its
    level changes the default here too)."""
    every = compile_flags(threads)
    opt = next((f for f in every if f.startswith("-O")), "-O2")
    arch = next((f for f in every if f.startswith("-march=")), "-march=native")
    flags = " ".join(f for f in every if f not in (opt, arch))
    libs = " ".join(["-lm", *(["-fopenmp"] if threads > 1 else []), *(["-lmvec"] if vector_math else [])])
    return f"""\
# Build the einjit model {prefix!r}: `make` builds lib{prefix}.a and the example program main.
# ARCH picks the target CPU (the default builds for this machine; e.g. ARCH=-march=x86-64-v2).
# The schedule (tile sizes, vector widths) was chosen for the exporting machine's kind of CPU.
CC ?= cc
AR ?= ar
ARCH ?= {arch}
OPT ?= {opt}
CFLAGS ?= -Wall -Wextra
EINJIT_FLAGS = $(OPT) $(ARCH) {flags}
LDLIBS = {libs}

all: lib{prefix}.a main

{prefix}.o: {prefix}.c {prefix}.h
\t$(CC) $(EINJIT_FLAGS) $(CFLAGS) -c {prefix}.c -o {prefix}.o

lib{prefix}.a: {prefix}.o
\t$(AR) rcs lib{prefix}.a {prefix}.o

lib{prefix}.so: {prefix}.c {prefix}.h
\t$(CC) $(EINJIT_FLAGS) $(CFLAGS) -fPIC -shared {prefix}.c -o lib{prefix}.so $(LDLIBS)

main: main.c {prefix}.h lib{prefix}.a
\t$(CC) $(OPT) $(CFLAGS) main.c lib{prefix}.a $(LDLIBS) -o main

clean:
\trm -f {prefix}.o lib{prefix}.a lib{prefix}.so main

.PHONY: all clean
"""
