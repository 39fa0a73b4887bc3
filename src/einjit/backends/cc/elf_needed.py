"""The shared libraries a compiled program needs (its ELF `DT_NEEDED` entries), read from its bytes.

Loading a program tells what it runs on: one linked on libgomp needs `libgomp.so.1` (whose
wait setting `openmp_env.prepare` makes before it loads), one linked on einjit's thread team
needs the team's library by its soname (`thread_team.load` loads it first). Reading the
program's own dynamic section answers that exactly, without running a tool.
"""

from __future__ import annotations

import struct

__all__ = ["needed"]

_PT_LOAD, _PT_DYNAMIC = 1, 2
_DT_NULL, _DT_NEEDED, _DT_STRTAB = 0, 1, 5


def needed(data: bytes) -> tuple[str, ...] | None:
    """The `DT_NEEDED` names of the 64-bit little-endian ELF shared object `data`, in order;
    None when `data` is not one or its dynamic section cannot be read (the caller then
    assumes the program may need anything)."""
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        return None
    try:
        phoff, = struct.unpack_from("<Q", data, 0x20)
        phentsize, phnum = struct.unpack_from("<HH", data, 0x36)
        segments = [struct.unpack_from("<IIQQQQ", data, phoff + k * phentsize) for k in range(phnum)]
        loads = [(vaddr, offset, filesz) for kind, _, offset, vaddr, _, filesz in segments if kind == _PT_LOAD]
        dynamic = next((offset, filesz) for kind, _, offset, _, _, filesz in segments if kind == _PT_DYNAMIC)
        entries = [struct.unpack_from("<qQ", data, dynamic[0] + k * 16) for k in range(dynamic[1] // 16)]
        entries = entries[:next((k for k, (tag, _) in enumerate(entries) if tag == _DT_NULL), len(entries))]
        strtab = next(value for tag, value in entries if tag == _DT_STRTAB)
        base = next(offset + strtab - vaddr for vaddr, offset, filesz in loads if vaddr <= strtab < vaddr + filesz)
        names = []
        for tag, value in entries:
            if tag == _DT_NEEDED:
                end = data.index(b"\0", base + value)
                names.append(data[base + value:end].decode("utf-8", "replace"))
    except (struct.error, StopIteration, ValueError):
        return None
    return tuple(names)
