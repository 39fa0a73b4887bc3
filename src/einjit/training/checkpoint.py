"""Checkpoints: parameter values in the safetensors format, keyed by tensor labels.

einjit writes and reads the format itself with NumPy (an 8-byte little-endian header length,
a JSON header `{name: {"dtype", "shape", "data_offsets"}}`, then the raw little-endian data),
so checkpoints need no extra package; files are interchangeable with the `safetensors`
package (extra `checkpoint`, with which the tests check compatibility both ways).

Saving is atomic (a temporary file in the same directory, flushed, then renamed), so a crash
never leaves a half-written checkpoint under the real name. Loading checks everything —
header, sizes, names, dims, dtypes — before writing anything, so a refused file leaves the
model as it was; values are written in place with `set_values`, so routines already compiled
continue from them (training resumes bit for bit).
"""

from __future__ import annotations

import itertools
import json
import os
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.tensor.tensor import Tensor

_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "U8": np.uint8, "I32": np.int32,
           "I64": np.int64}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
_MAX_HEADER = 100_000_000


class CheckpointError(EinjitError, ValueError):
    """A checkpoint that cannot be written, read, or does not fit the model."""


def _named(what: Tensor | Iterable[Tensor] | Mapping[str, Tensor]) -> dict[str, Tensor]:
    """Tensors by checkpoint name: a tensor's parameters, a list of tensors, or a mapping."""
    if isinstance(what, Mapping):
        return dict(what)
    tensors = what.params() if isinstance(what, Tensor) else list(what)
    named: dict[str, Tensor] = {}
    for t in tensors:
        other = named.setdefault(t.label_str, t)
        if other is not t:
            raise CheckpointError(f"einjit: two tensors are labelled {t.label_str!r}; checkpoints are keyed by label: "
                                  f"give them distinct labels, or pass a dict {{name: tensor}}")
    return named


def save(what: Tensor | Iterable[Tensor] | Mapping[str, Tensor], path: str | os.PathLike,
         metadata: Mapping[str, str] | None = None) -> None:
    """Write the values of `what` (a loss or model output: all parameters under it; or a list
    of tensors — parameters, scalars, optimizer state; or a `{name: tensor}` dict)."""
    sh.finish_inference()
    named = _named(what)
    header: dict[str, object] = {}
    arrays = []
    offset = 0
    for name in sorted(named):
        arr = np.ascontiguousarray(named[name].value.read())
        code = _CODES.get(arr.dtype)
        if code is None:
            raise CheckpointError(f"einjit: cannot save {name!r}: dtype {arr.dtype} has no safetensors code here")
        le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + le.nbytes]}
        arrays.append(le)
        offset += le.nbytes
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent or Path("."), prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for arr in arrays:
                f.write(arr.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, validated (a corrupted file raises `CheckpointError`)."""
    path = Path(path)
    try:
        blob = path.read_bytes()
    except OSError as e:
        raise CheckpointError(f"einjit: cannot read checkpoint {path}: {e}") from None
    if len(blob) < 8:
        raise CheckpointError(f"einjit: {path} is not a safetensors checkpoint: {len(blob)} bytes, no header")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > min(_MAX_HEADER, len(blob) - 8):
        raise CheckpointError(f"einjit: {path} is corrupted or not a safetensors file: header length {n} "
                              f"exceeds the file's {len(blob)} bytes")
    try:
        header = json.loads(blob[8:8 + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"einjit: {path} is corrupted: its header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"einjit: {path} is corrupted: its header is not a JSON object")
    data = memoryview(blob)[8 + n:]
    out: dict[str, np.ndarray] = {}
    ends = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
            shape = tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"einjit: {path}: entry {name!r} is malformed or has an unsupported dtype: "
                                  f"{info!r}") from None
        size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        if not 0 <= begin <= end <= len(data) or end - begin != size:
            raise CheckpointError(f"einjit: {path} is corrupted: {name!r} ({info['dtype']} {list(shape)}) needs "
                                  f"{size} bytes at {begin}..{end} of {len(data)} data bytes")
        out[name] = np.frombuffer(data[begin:end], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
        ends.append((begin, end))
    ends.sort()
    if ends and (ends[0][0] != 0 or ends[-1][1] != len(data)
                 or any(a[1] != b[0] for a, b in itertools.pairwise(ends))):
        raise CheckpointError(f"einjit: {path} is corrupted: its data is not one contiguous block "
                              f"({len(data)} bytes, entries at {ends[:4]}...)")
    return out


def load(what: Tensor | Iterable[Tensor] | Mapping[str, Tensor], path: str | os.PathLike) -> None:
    """Write a checkpoint's values into the tensors of `what` (named as in `save`), refusing —
    and changing nothing — unless names, dims and dtypes all match."""
    sh.finish_inference()
    named = _named(what)
    arrays = read(path)
    problems = [f"missing from the file: {name!r}" for name in sorted(set(named) - set(arrays))]
    problems += [f"in the file but not in the model: {name!r}" for name in sorted(set(arrays) - set(named))]
    for name in sorted(set(named) & set(arrays)):
        t, arr = named[name], arrays[name]
        if tuple(arr.shape) != t.dims:
            problems.append(f"{name!r}: dims {t.dims} in the model, {tuple(arr.shape)} in the file")
        if arr.dtype != t.dtype:
            problems.append(f"{name!r}: dtype {t.dtype} in the model, {arr.dtype} in the file")
    if problems:
        raise CheckpointError(f"einjit: checkpoint {path} does not fit the model (nothing was loaded):\n  "
                              + "\n  ".join(problems))
    for name, t in named.items():
        t.set_values(arrays[name])
