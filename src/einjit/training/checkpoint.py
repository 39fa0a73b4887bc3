"""Checkpoints: a model's state in the safetensors format, keyed by tensor labels.

A model's state is what a PyTorch `state_dict` holds: its parameters *and* its buffers, the
state tensors its layers keep between calls (`nn.BatchNorm`'s running statistics, random-number
counters). An optimizer's state — learning rate, schedule position, step count, moments — is
saved and loaded with it through `optimizer=`, so a resumed run repeats an uninterrupted one
bit for bit. The file's metadata lists which entries are optimizer state (`_OPTIMIZER_KEY`),
so a model alone loads from it, as `model.load_state_dict(torch.load(f)["model"])` would:
`load` without `optimizer=` skips those entries and returns them.

einjit writes and reads the format itself with NumPy (an 8-byte little-endian header length,
a JSON header `{name: {"dtype", "shape", "data_offsets"}}`, then the raw little-endian data),
so checkpoints need no extra package; files are interchangeable with the `safetensors`
package (extra `checkpoint`, with which the tests check compatibility both ways). The header
key `__metadata__` is the format's own, so no tensor may be named so.

Saving is atomic (a temporary file in the same directory, flushed, then renamed), so a crash
or a full disk never leaves a half-written checkpoint under the real name, and the old file
stays as it was. The file gets the mode a plain `open(path, "wb")` would give it: an existing
file's, else `0666` less the umask (not the temporary file's private `0600`). Reading looks at
the header and the file's size before allocating anything, so an absurd header or an endless
file (a device, a pipe) is refused cheaply. Loading checks everything — header, sizes, names,
dims, dtypes, and that every target can be written — before writing anything, so a refused
file leaves the model as it was; values are written in place, so routines already compiled
continue from them. Every failure is a `CheckpointError` naming the path and the cause.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import BinaryIO, Protocol, runtime_checkable

import numpy as np

from einjit import shape as sh
from einjit.errors import EinjitError
from einjit.tensor import random as rnd
from einjit.tensor.tensor import Tensor, TensorError

_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "U8": np.uint8, "I32": np.int32,
           "I64": np.int64}
_CODES = {np.dtype(v): k for k, v in _DTYPES.items()}
_MAX_HEADER = 100_000_000
_RESERVED = "__metadata__"
_OPTIMIZER_KEY = "einjit.optimizer_state"
"""The metadata entry listing (as a JSON array) the names that hold optimizer state."""


class CheckpointError(EinjitError, ValueError):
    """A checkpoint that cannot be written, read, or does not fit the model."""


@runtime_checkable
class Stateful(Protocol):
    """Anything that keeps state in tensors: layers and optimizers (`state_tensors()`)."""

    def state_tensors(self) -> dict[str, Tensor]: ...


Saveable = Tensor | Stateful | Iterable["Tensor | Stateful"] | Mapping[str, Tensor]


def state_of(t: Tensor) -> dict[str, Tensor]:
    """The state under a loss or model output: its parameters and buffers (state tensors such
    as running statistics and random counters), by label."""
    found: dict[str, Tensor] = {}
    for x in t.subtree():
        if x.is_param or x.op_label == "state":
            _add(found, x.label_str, x)
        elif x.op_label == "uniform":
            c = rnd.counter(x)
            _add(found, c.label_str, c)
    return found


def _add(named: dict[str, Tensor], name: str, t: Tensor) -> None:
    if not isinstance(name, str):
        raise CheckpointError(f"einjit: checkpoint names are strings, got {name!r} for {t.describe()}")
    if name == _RESERVED:
        raise CheckpointError(f"einjit: tensor {t.describe()} cannot be checkpointed under the name {name!r}: the "
                              f"safetensors format reserves it for the file's metadata; give it another label, or "
                              f"pass a dict {{name: tensor}}")
    other = named.setdefault(name, t)
    if other is not t:
        raise CheckpointError(f"einjit: two tensors are named {name!r} ({other.describe()} and {t.describe()}); "
                              f"checkpoints are keyed by label: give them distinct labels, or pass a dict "
                              f"{{name: tensor}}")


def _named(what: Saveable, optimizer: Stateful | Iterable[Stateful] | None) -> dict[str, Tensor]:
    """Tensors by checkpoint name: a tensor's parameters and buffers, a layer's or an
    optimizer's state, a list of tensors (each itself) and such objects, or a mapping; then
    the optimizers' state."""
    named: dict[str, Tensor] = {}
    parts: list[Tensor | Stateful] | None = None
    if isinstance(what, Mapping):
        for name, t in what.items():
            _add(named, name, _tensor(t, name))
    elif isinstance(what, Tensor):
        for name, t in state_of(what).items():
            _add(named, name, t)
    elif isinstance(what, Stateful):
        parts = [what]
    else:
        parts = list(what)
    optimizers = [] if optimizer is None else [optimizer] if isinstance(optimizer, Stateful) else list(optimizer)
    for part in [*(parts or []), *optimizers]:
        if isinstance(part, Tensor):
            _add(named, part.label_str, part)
        elif isinstance(part, Stateful):
            for name, t in part.state_tensors().items():
                _add(named, name, t)
        else:
            raise CheckpointError(f"einjit: cannot checkpoint {part!r}: expected tensors, layers or optimizers")
    return named


def _tensor(t: object, name: str) -> Tensor:
    if not isinstance(t, Tensor):
        raise CheckpointError(f"einjit: checkpoint entry {name!r} is {type(t).__name__}, not a tensor")
    return t


def _path(path: object) -> Path:
    if not isinstance(path, (str, os.PathLike)):
        raise CheckpointError(f"einjit: a checkpoint path is a str or os.PathLike, got {type(path).__name__} "
                              f"{str(path)[:100]!r}")
    p = Path(path)
    if "\0" in str(p):
        raise CheckpointError(f"einjit: checkpoint path {str(p)[:200]!r} contains a NUL byte")
    return p


def _io_error(action: str, path: Path, e: OSError) -> CheckpointError:
    cause = e.strerror or str(e)
    return CheckpointError(f"einjit: cannot {action} checkpoint {path}: {cause} (errno {e.errno})"
                           if e.errno is not None else f"einjit: cannot {action} checkpoint {path}: {cause}")


def save(what: Saveable, path: str | os.PathLike, *, optimizer: Stateful | Iterable[Stateful] | None = None,
         metadata: Mapping[str, str] | None = None) -> None:
    """Write the state of `what` — a loss or model output (every parameter and buffer under
    it), a layer, a list of tensors (parameters, scalars, optimizer state) or a `{name:
    tensor}` dict — and of `optimizer` (one or several) to `path`, atomically."""
    path = _path(path)
    sh.finish_inference()
    named = _named(what, optimizer)
    optimizer_names = sorted(set(named) - set(_named(what, None)))
    if metadata and _OPTIMIZER_KEY in metadata:
        raise CheckpointError(f"einjit: checkpoint metadata key {_OPTIMIZER_KEY!r} is einjit's own (it lists the "
                              f"optimizer state); name your entry otherwise")
    if optimizer_names:
        metadata = {**(metadata or {}), _OPTIMIZER_KEY: json.dumps(optimizer_names)}
    write({name: named[name].value.read() for name in named}, path, metadata)


def write(arrays: Mapping[str, np.ndarray], path: str | os.PathLike, metadata: Mapping[str, str] | None = None) -> None:
    """Write named arrays as a safetensors file (sorted by name, so the bytes depend only on
    names and values), atomically; an I/O failure is a `CheckpointError` and leaves an old file
    at `path` intact."""
    path = _path(path)
    header: dict[str, object] = {}
    blobs = []
    offset = 0
    for name in sorted(arrays):
        arr = np.ascontiguousarray(arrays[name])
        code = _CODES.get(arr.dtype)
        if code is None:
            raise CheckpointError(f"einjit: cannot save {name!r}: dtype {arr.dtype} has no safetensors code here")
        le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        header[name] = {"dtype": code, "shape": list(arr.shape), "data_offsets": [offset, offset + le.nbytes]}
        blobs.append(le)
        offset += le.nbytes
    if metadata:
        header[_RESERVED] = {str(k): str(v) for k, v in metadata.items()}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".einjit-", suffix=".tmp")
    except OSError as e:
        raise _io_error("write", path, e) from None
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _plain_file_mode(path))
            f.write(struct.pack("<Q", len(text)))
            f.write(text)
            for arr in blobs:
                f.write(arr.tobytes())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        _remove(tmp)
        raise _io_error("write", path, e) from None
    except BaseException:
        _remove(tmp)
        raise


def _plain_file_mode(path: Path) -> int:
    """The mode `open(path, "wb")` gives: the existing file's, else 0666 less the umask."""
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except OSError:
        return 0o666 & ~_umask()


def _umask() -> int:
    """The process umask, read without changing it where Linux tells it (setting it to read it
    back would briefly change it for every thread)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o077)
    os.umask(mask)
    return mask


def _remove(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _read_exactly(f: BinaryIO, n: int, path: Path, what: str) -> bytes:
    blob = f.read(n)
    if len(blob) != n:
        raise CheckpointError(f"einjit: {path} is truncated: {what} needs {n} bytes, the file has {len(blob)} left")
    return blob


def read(path: str | os.PathLike) -> dict[str, np.ndarray]:
    """The arrays of a safetensors file, validated (a corrupted file raises `CheckpointError`)."""
    return _read(path)[0]


def _read(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """The arrays and the metadata of a safetensors file."""
    path = _path(path)
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise CheckpointError(f"einjit: cannot read checkpoint {path}: not a regular file (a directory, "
                                      f"device or pipe has no size to check before reading)")
            return _parse(f, info.st_size, path)
    except OSError as e:
        raise _io_error("read", path, e) from None


def _parse(f: BinaryIO, size: int, path: Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    if size < 8:
        raise CheckpointError(f"einjit: {path} is not a safetensors checkpoint: {size} bytes, no header")
    (n,) = struct.unpack("<Q", _read_exactly(f, 8, path, "the header length"))
    if n > min(_MAX_HEADER, size - 8):
        raise CheckpointError(f"einjit: {path} is corrupted or not a safetensors file: header length {n} "
                              f"exceeds the file's {size} bytes (or the limit of {_MAX_HEADER})")
    try:
        header = json.loads(_read_exactly(f, n, path, "the header").decode())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise CheckpointError(f"einjit: {path} is corrupted: its header is not JSON ({type(e).__name__})") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"einjit: {path} is corrupted: its header is not a JSON object")
    data_size = size - 8 - n
    entries = {name: _entry(path, name, info, data_size) for name, info in header.items() if name != _RESERVED}
    spans = sorted((begin, end) for _, _, begin, end in entries.values())
    if spans and (spans[0][0] != 0 or spans[-1][1] != data_size
                  or any(a[1] != b[0] for a, b in itertools.pairwise(spans))):
        raise CheckpointError(f"einjit: {path} is corrupted: its data is not one contiguous block "
                              f"({data_size} bytes, entries at {spans[:4]}...)")
    if not entries and data_size:
        raise CheckpointError(f"einjit: {path} is corrupted: {data_size} data bytes but no entries")
    metadata = header.get(_RESERVED, {})
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise CheckpointError(f"einjit: {path} is corrupted: its {_RESERVED} is not a map of strings")
    data = _read_exactly(f, data_size, path, "the data")
    view = memoryview(data)
    return {name: np.frombuffer(view[begin:end], dtype=dtype).reshape(shape).astype(dtype.newbyteorder("="))
            for name, (dtype, shape, begin, end) in entries.items()}, metadata


def _optimizer_names(metadata: Mapping[str, str], path: Path) -> set[str]:
    text = metadata.get(_OPTIMIZER_KEY)
    if text is None:
        return set()
    try:
        names = json.loads(text)
    except (json.JSONDecodeError, RecursionError):
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise CheckpointError(f"einjit: {path} is corrupted: its metadata {_OPTIMIZER_KEY!r} is not a list of names")
    return set(names)


def _entry(path: Path, name: str, info: object, data_size: int) -> tuple[np.dtype, tuple[int, ...], int, int]:
    """One header entry, checked against the data's size with Python integers (an absurd shape
    cannot overflow or allocate)."""
    malformed = CheckpointError(f"einjit: {path}: entry {name!r} is malformed or has an unsupported dtype: "
                                f"{str(info)[:200]}")
    if not isinstance(info, dict):
        raise malformed
    try:
        dtype = np.dtype(_DTYPES[info["dtype"]]).newbyteorder("<")
        shape = tuple(info["shape"])
        begin, end = info["data_offsets"]
    except (KeyError, TypeError, ValueError):
        raise malformed from None
    if not all(type(d) is int and d >= 0 for d in (*shape, begin, end)):
        raise malformed
    size = math.prod(shape) * dtype.itemsize
    if not begin <= end <= data_size or end - begin != size:
        raise CheckpointError(f"einjit: {path} is corrupted: {name!r} ({info['dtype']} {list(shape)[:8]}) needs "
                              f"{size} bytes at {begin}..{end} of {data_size} data bytes")
    return dtype, shape, begin, end


def load(what: Saveable, path: str | os.PathLike, *,
         optimizer: Stateful | Iterable[Stateful] | None = None) -> dict[str, np.ndarray]:
    """Write a checkpoint's values into the tensors of `what` and `optimizer` (named as in
    `save`), refusing — and changing nothing — unless names, dims and dtypes all match and
    every target can be written. Without `optimizer=`, the optimizer state a file was saved
    with is not loaded: it is returned, by name (an empty dict otherwise)."""
    sh.finish_inference()
    named = _named(what, optimizer)
    arrays, metadata = _read(path)
    skipped = {} if optimizer is not None else {
        name: arrays.pop(name) for name in sorted(_optimizer_names(metadata, _path(path)) - set(named))
        if name in arrays}
    problems = [f"missing from the file: {name!r}" for name in sorted(set(named) - set(arrays))]
    problems += [f"in the file but not in the model: {name!r}" for name in sorted(set(arrays) - set(named))]
    writes = []
    for name in sorted(set(named) & set(arrays)):
        t, arr = named[name], arrays[name]
        if tuple(arr.shape) != t.dims:
            problems.append(f"{name!r}: dims {t.dims} in the model, {tuple(arr.shape)} in the file")
        elif arr.dtype != t.dtype:
            problems.append(f"{name!r}: dtype {t.dtype} in the model, {arr.dtype} in the file")
        else:
            try:
                writes.append(t.value.staged(arr))
            except TensorError as e:
                problems.append(f"{name!r}: {e}")
    if problems:
        raise CheckpointError(f"einjit: checkpoint {path} does not fit the model (nothing was loaded):\n  "
                              + "\n  ".join(problems))
    for write in writes:
        write()
    return skipped
