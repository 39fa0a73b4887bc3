"""Tensor nodes: the arrays that assignments read and write, with their memory modes.

A memory mode is modelled as the set of concrete storage decisions it still allows
("leaves"): `Never_virtual` allows local, on-device and hosted storage, `Device_only` allows
local and on-device, and so on. An update intersects the two sets; an empty intersection is a
conflict, reported with both provenances. This makes `update_memory_mode` consistent by
construction instead of a table of special cases.
"""

from __future__ import annotations

import enum
import itertools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from einjit import memory
from einjit.errors import EinjitError
from einjit.ir import naming, ops


class MemoryType(enum.Enum):
    CONSTANT = "Constant"
    NONCONSTANT = "Nonconstant"
    CHANGED_ON_DEVICES = "Changed_on_devices"
    VOLATILE = "Volatile"


class _Leaf(enum.Enum):
    VIRTUAL = 1
    LOCAL = 2
    ON_DEVICE = 3
    HOSTED_CONSTANT = 4
    HOSTED_CHANGED = 5
    HOSTED_VOLATILE = 6


_HOSTED_LEAVES = {
    MemoryType.CONSTANT: frozenset({_Leaf.HOSTED_CONSTANT}),
    MemoryType.NONCONSTANT: frozenset({_Leaf.HOSTED_CHANGED, _Leaf.HOSTED_VOLATILE}),
    MemoryType.CHANGED_ON_DEVICES: frozenset({_Leaf.HOSTED_CHANGED}),
    MemoryType.VOLATILE: frozenset({_Leaf.HOSTED_VOLATILE}),
}
_ALL_HOSTED = frozenset(_HOSTED_LEAVES[MemoryType.CONSTANT] | _HOSTED_LEAVES[MemoryType.NONCONSTANT])


class MemoryMode(enum.Enum):
    EFFECTIVELY_CONSTANT = "Effectively_constant"
    VIRTUAL = "Virtual"
    NEVER_VIRTUAL = "Never_virtual"
    LOCAL = "Local"
    DEVICE_ONLY = "Device_only"
    ON_DEVICE = "On_device"
    MATERIALIZED = "Materialized"
    HOSTED = "Hosted"


@dataclass(frozen=True, slots=True)
class Mode:
    """A memory mode; `memory_type` is set exactly when `mode` is `HOSTED`."""

    mode: MemoryMode
    memory_type: MemoryType | None = None

    def __post_init__(self) -> None:
        if (self.mode is MemoryMode.HOSTED) != (self.memory_type is not None):
            raise ValueError("einjit: a Hosted memory mode needs a memory type, and only it")

    def __str__(self) -> str:
        if self.memory_type is not None:
            return f"Hosted {self.memory_type.value}"
        return self.mode.value

    @property
    def leaves(self) -> frozenset[_Leaf]:
        match self.mode:
            case MemoryMode.EFFECTIVELY_CONSTANT:
                return frozenset({_Leaf.VIRTUAL, _Leaf.HOSTED_CONSTANT})
            case MemoryMode.VIRTUAL:
                return frozenset({_Leaf.VIRTUAL})
            case MemoryMode.NEVER_VIRTUAL:
                return frozenset({_Leaf.LOCAL, _Leaf.ON_DEVICE}) | _ALL_HOSTED
            case MemoryMode.LOCAL:
                return frozenset({_Leaf.LOCAL})
            case MemoryMode.DEVICE_ONLY:
                return frozenset({_Leaf.LOCAL, _Leaf.ON_DEVICE})
            case MemoryMode.ON_DEVICE:
                return frozenset({_Leaf.ON_DEVICE})
            case MemoryMode.MATERIALIZED:
                return frozenset({_Leaf.ON_DEVICE}) | _ALL_HOSTED
            case MemoryMode.HOSTED:
                assert self.memory_type is not None  # set exactly when the mode is HOSTED
                return _HOSTED_LEAVES[self.memory_type]
        raise AssertionError(self.mode)


def hosted(memory_type: MemoryType = MemoryType.NONCONSTANT) -> Mode:
    return Mode(MemoryMode.HOSTED, memory_type)


VIRTUAL = Mode(MemoryMode.VIRTUAL)
NEVER_VIRTUAL = Mode(MemoryMode.NEVER_VIRTUAL)
LOCAL = Mode(MemoryMode.LOCAL)
DEVICE_ONLY = Mode(MemoryMode.DEVICE_ONLY)
ON_DEVICE = Mode(MemoryMode.ON_DEVICE)
MATERIALIZED = Mode(MemoryMode.MATERIALIZED)
EFFECTIVELY_CONSTANT = Mode(MemoryMode.EFFECTIVELY_CONSTANT)

_ALL_MODES = [Mode(m) for m in MemoryMode if m is not MemoryMode.HOSTED] + [hosted(t) for t in MemoryType]


def _mode_of_leaves(leaves: frozenset[_Leaf]) -> Mode | None:
    for m in _ALL_MODES:
        if m.leaves == leaves:
            return m
    return None


class MemoryModeError(EinjitError, ValueError):
    pass


_tnode_ids = itertools.count(1)


_replaced = [0]


def host_arrays_replaced() -> int:
    """How many times a node's host array was replaced by another. Routines that compute in host
    arrays hold their addresses; one integer compare per call tells them when to look whether
    one of theirs was swapped (reading the old array would silently give stale values)."""
    return _replaced[0]


class Tnode:
    """A tensor node. Identity matters (two nodes with equal dims are different arrays), so it
    is an ordinary object hashed by identity, not a dataclass.

    `dims` may be given as a zero-argument callable: shape inference fixes dimensions only
    when the program is compiled, and the node must exist before that.
    """

    __slots__ = ("id", "label", "prec", "_dims", "memory_mode", "provenance", "_array", "__weakref__")

    def __init__(self, label: str | list[str], dims: tuple[int, ...] | Callable[[], tuple[int, ...]],
                 prec: ops.Prec = ops.single, *, memory_mode: Mode | None = None, provenance: int = 0):
        self.id = next(_tnode_ids)
        self.label: list[str] = [label] if isinstance(label, str) else list(label)
        self.prec = prec
        self._dims = dims
        self.memory_mode: Mode | None = memory_mode
        self.provenance: int = provenance
        self._array: np.ndarray | None = None

    @property
    def array(self) -> np.ndarray | None:
        """The host array, if the node has one."""
        return self._array

    @array.setter
    def array(self, value: np.ndarray | None) -> None:
        if self._array is not None and value is not self._array:
            _replaced[0] += 1
        self._array = value

    @property
    def dims(self) -> tuple[int, ...]:
        if callable(self._dims):
            self._dims = tuple(int(d) for d in self._dims())
        return self._dims

    @property
    def size(self) -> int:
        return math.prod(self.dims)

    @property
    def name(self) -> str:
        """A C identifier derived from the label: inside `naming.stable_names()` the program's
        name for the node (label and order of appearance), elsewhere unique by the global id."""
        names = naming.current()
        if names is not None:
            return names.node(self)
        return f"{naming.node_base(self.label)}_{self.id}"

    def debug_name(self) -> str:
        return f"{'.'.join(self.label) or 'n'}#{self.id}"

    def __repr__(self) -> str:
        dims = self._dims if not callable(self._dims) else "?"
        return f"<Tnode {self.debug_name()} {dims} {self.prec.name}>"

    def update_memory_mode(self, mode: Mode, provenance: int) -> None:
        """Narrow the memory mode; a contradiction names both modes and both provenances."""
        if self.memory_mode is None:
            self.memory_mode, self.provenance = mode, provenance
            return
        common = self.memory_mode.leaves & mode.leaves
        if not common:
            from einjit.ir.passes.local_storage import local_mode_conflict  # it builds on this module
            advice = local_mode_conflict(self)
            raise MemoryModeError(
                f"einjit: inconsistent memory mode for tensor {self.debug_name()}: it is "
                f"{self.memory_mode} (provenance {self.provenance}) and cannot become {mode} "
                f"(provenance {provenance})" + (f"; {advice}" if advice else ""))
        if common == self.memory_mode.leaves:
            return
        narrowed = mode if common == mode.leaves else _mode_of_leaves(common)
        if narrowed is None:
            raise MemoryModeError(
                f"einjit: memory modes {self.memory_mode} (provenance {self.provenance}) and "
                f"{mode} (provenance {provenance}) of {self.debug_name()} have no common named mode")
        self.memory_mode, self.provenance = narrowed, provenance

    def is_virtual(self) -> bool:
        return self.memory_mode is not None and self.memory_mode.leaves == frozenset({_Leaf.VIRTUAL})

    def is_materialized_known(self) -> bool:
        """Whether the mode already excludes virtualization."""
        return self.memory_mode is not None and _Leaf.VIRTUAL not in self.memory_mode.leaves

    def is_hosted(self) -> bool:
        return self.memory_mode is not None and self.memory_mode.leaves <= _ALL_HOSTED

    def can_be_hosted(self) -> bool:
        """Whether the memory mode still allows a host array (an undecided mode does)."""
        return self.memory_mode is None or bool(self.memory_mode.leaves & _ALL_HOSTED)

    def is_local(self) -> bool:
        return self.memory_mode is not None and self.memory_mode.leaves == frozenset({_Leaf.LOCAL})

    def is_constant(self) -> bool:
        return self.memory_mode is not None and self.memory_mode.leaves == _HOSTED_LEAVES[MemoryType.CONSTANT]

    def host_array(self) -> np.ndarray:
        """The host copy of a hosted node, allocated (zeroed) on first use."""
        if self.array is None:
            self.array = memory.zeros(self.debug_name(), self.dims, self.prec.dtype)
        return self.array
