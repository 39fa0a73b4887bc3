"""How backends store nodes and call routines: memory classes and routine parameters.

They sit beside the backend interface rather than in a renderer, so the interface, the
renderers and the backends all import them from here (seed 001: a memory class says how a
backend stores a node's array; a routine records the class of every node it touches).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

from einjit.ir.indexing import StaticSymbol
from einjit.ir.tnode import Tnode

__all__ = ["CudaMemClass", "MemClass", "Param", "ParamKind", "repeated_names"]


class MemClass(enum.Enum):
    """How a CPU backend stores a node (seed 001's `Cpu_mem_class`)."""

    LOCAL_ONLY = "Local_only"
    """Only needed within one routine call: an array local to the C function."""
    FROM_CONTEXT = "From_context"
    """The context's array, passed to the routine."""
    CONSTANT_FROM_HOST = "Constant_from_host"
    """A constant hosted node the routine only reads: read from the host array."""

    @staticmethod
    def locals_on_stack(local_nodes: Iterable[Tnode]) -> set[Tnode]:
        """Which routine-local nodes live on the C stack; the others live in scratch arrays
        (the renderer's placement rule, `c_syntax.local_placement`)."""
        from einjit.backends.c_syntax import local_placement  # the renderer imports this module

        return local_placement(local_nodes).on_stack


class CudaMemClass(enum.Enum):
    """How the CUDA backend stores a node (seed 001)."""

    LOCAL_ONLY = "Local_only"
    """Only needed within one thread's share of a computation: a per-thread local array."""
    GLOBAL = "Global"
    """Computed directly in the device's global memory (one array per context)."""

    @staticmethod
    def locals_on_stack(local_nodes: Iterable[Tnode]) -> set[Tnode]:
        """Every routine-local node lives in a thread's local memory: none needs scratch."""
        return set(local_nodes)


class ParamKind(enum.Enum):
    ARRAY = "array"
    MERGE_BUFFER = "merge_buffer"
    SCRATCH = "scratch"
    """A routine-local array too large for the stack, which the backend allocates once (per
    context and node; memory class `LOCAL_ONLY`: its values are not needed between calls)."""
    STATIC = "static"


@dataclass(frozen=True, slots=True, eq=False)
class Param:
    """One parameter of a rendered routine, in calling order."""

    kind: ParamKind
    c_name: str
    tn: Tnode | None = None
    mem: MemClass | None = None
    static: StaticSymbol | None = None

    @property
    def node(self) -> Tnode:
        """The node of an array or merge-buffer parameter (every such parameter has one)."""
        assert self.tn is not None, self
        return self.tn

    def __repr__(self) -> str:
        what = self.tn.debug_name() if self.tn is not None else repr(self.static)
        mem = f" {self.mem.value}" if self.mem is not None else ""
        return f"<Param {self.kind.value} {self.c_name}: {what}{mem}>"


def repeated_names(names: Iterable[str]) -> list[str]:
    """The routine names given more than once, sorted: functions of one program, and
    routines of one batch, must have distinct names."""
    seen: set[str] = set()
    repeated: set[str] = set()
    for n in names:
        (repeated if n in seen else seen).add(n)
    return sorted(repeated)
