"""What the renderers of intrinsic kernels (`bf16_dot`, `amx_tiles`) need of the C renderer's
writer (`c_syntax._Writer`): a protocol, so that they render into its output without importing
the renderer that calls them."""

from __future__ import annotations

from typing import Protocol

from einjit.ir.indexing import AxisIndex, Symbol
from einjit.ir.tnode import Tnode

__all__ = ["Writer"]


class Writer(Protocol):
    loops: dict[Symbol, tuple[int, int]]
    helpers: set[str]
    index_type: str

    def node_name(self, tn: Tnode, written: bool = False) -> str: ...

    def index(self, tn: Tnode, idcs: tuple[AxisIndex, ...], what: str, extra_last: int = 0) -> str: ...
