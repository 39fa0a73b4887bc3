"""Communicators: collective operations between the ranks of a data-parallel job.

Devices of one backend exchange arrays through merge buffers (`einjit.training.parallel.DataParallel`);
ranks that do not share a backend — threads with their own contexts, or processes on several
machines — exchange NumPy arrays through a `Communicator` instead. The protocol is the small
subset of MPI that data parallelism needs: `allreduce` (in place), `broadcast` and `barrier`.

Two implementations:
- `InProcessGroup(n).communicators`: n ranks in one process, one thread each, meeting at a
  shared rendezvous. It lets tests (and notebooks) simulate n ranks without MPI, and its
  reductions are deterministic: every rank adds the ranks' arrays in rank order, so all ranks
  get bit-identical results.
- `MpiCommunicator()`: `mpi4py` over `MPI.COMM_WORLD` (the `mpi` extra); start the job with
  `mpiexec -n N python ...`.
"""

from __future__ import annotations

import threading
from typing import Any, Callable, Protocol, runtime_checkable

import numpy as np

__all__ = ["Communicator", "InProcessCommunicator", "InProcessGroup", "MpiCommunicator", "REDUCE_OPS", "import_mpi"]

REDUCE_OPS: dict[str, Callable[..., np.ndarray]] = {
    "sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum,
}


@runtime_checkable
class Communicator(Protocol):
    """One rank's view of a group of `size` ranks; every rank must make the same calls in the
    same order (they are collective)."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def allreduce(self, array: np.ndarray, op: str = "sum") -> None:
        """Replace `array`, on every rank, by the reduction of all ranks' arrays."""

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        """Overwrite `array` on every rank with the root's."""

    def barrier(self) -> None:
        """Return once every rank has called it."""


def _check_op(op: str) -> None:
    if op not in REDUCE_OPS:
        raise ValueError(f"einjit: unknown reduction {op!r}; use one of {', '.join(REDUCE_OPS)}")


def _check_array(array: Any, what: str) -> None:
    if not isinstance(array, np.ndarray) or not array.flags.c_contiguous or not array.flags.writeable:
        raise TypeError(f"einjit: {what} works in place on a writeable C-contiguous NumPy array, got "
                        f"{type(array).__name__}")


def _check_root(root: int, size: int) -> None:
    if not 0 <= root < size:
        raise ValueError(f"einjit: broadcast root {root} is not a rank of a group of {size}")


# ---------------------------------------------------------------- in one process


class InProcessGroup:
    """`size` ranks in one process, to be driven by one thread each.

    A collective publishes each rank's array in a slot and meets the other ranks at a barrier.
    Every rank checks all the slots, so a mismatch (a different shape, say) raises on all ranks
    alike; a rank that fails on its own leaves the others to the barrier's `timeout`
    (`threading.BrokenBarrierError`), so a bad call never leaves a thread waiting forever.
    """

    def __init__(self, size: int, *, timeout: float | None = 120.0):
        if size < 1:
            raise ValueError(f"einjit: a group needs at least one rank, got {size}")
        self.size = size
        self._barrier = threading.Barrier(size, timeout=timeout)
        self._slots: list[np.ndarray | None] = [None] * size
        self.communicators: tuple[InProcessCommunicator, ...] = tuple(
            InProcessCommunicator(self, r) for r in range(size))

    def __repr__(self) -> str:
        return f"<InProcessGroup of {self.size} ranks>"

    def _meet(self) -> None:
        self._barrier.wait()

    def _check_alike(self, what: str, root: int) -> np.ndarray:
        """The root's slot, once every rank's array is known to match it."""
        source = self._slots[root]
        assert source is not None  # every rank filled its slot before meeting
        for r, a in enumerate(self._slots):
            assert a is not None
            if a.shape != source.shape or a.dtype != source.dtype:
                raise ValueError(f"einjit: {what}: rank {r} passed {a.dtype}{list(a.shape)} but rank {root} passed "
                                 f"{source.dtype}{list(source.shape)}")
        return source


class InProcessCommunicator:
    """One rank of an `InProcessGroup`."""

    def __init__(self, group: InProcessGroup, rank: int):
        self.group = group
        self._rank = rank

    def __repr__(self) -> str:
        return f"<InProcessCommunicator rank {self._rank} of {self.group.size}>"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self.group.size

    def allreduce(self, array: np.ndarray, op: str = "sum") -> None:
        _check_op(op)
        _check_array(array, "allreduce")
        g = self.group
        g._slots[self._rank] = array
        g._meet()
        result = g._check_alike("allreduce", 0).copy()
        reduce = REDUCE_OPS[op]
        for a in g._slots[1:]:
            reduce(result, a, out=result)
        g._meet()
        array[...] = result

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        _check_array(array, "broadcast")
        _check_root(root, self.size)
        g = self.group
        g._slots[self._rank] = array
        g._meet()
        source = g._check_alike("broadcast", root)
        if self._rank != root:
            array[...] = source
        g._meet()

    def barrier(self) -> None:
        self.group._meet()


# ---------------------------------------------------------------- MPI


def import_mpi() -> Any:
    """`mpi4py.MPI`, or an ImportError naming the extra that provides it."""
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("einjit: MPI communication needs mpi4py and an MPI library: "
                          "pip install 'einjit[mpi]' (mpi4py + mpich), then run under mpiexec") from e
    return MPI


class MpiCommunicator:
    """A communicator over `mpi4py` (by default `MPI.COMM_WORLD`).

    Allreduce is MPI's. With two ranks the sum is the same on both (addition commutes); with
    more, the MPI standard only recommends that every rank get the same result, so replicas
    that must stay bit-identical can broadcast their parameters from one rank now and then.
    """

    def __init__(self, comm: Any = None):
        self._mpi = import_mpi()
        self.comm = self._mpi.COMM_WORLD if comm is None else comm
        self._ops = {"sum": self._mpi.SUM, "prod": self._mpi.PROD, "max": self._mpi.MAX, "min": self._mpi.MIN}

    def __repr__(self) -> str:
        return f"<MpiCommunicator rank {self.rank} of {self.size}>"

    @property
    def rank(self) -> int:
        return self.comm.Get_rank()

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    def allreduce(self, array: np.ndarray, op: str = "sum") -> None:
        _check_op(op)
        _check_array(array, "allreduce")
        self.comm.Allreduce(self._mpi.IN_PLACE, array, op=self._ops[op])

    def broadcast(self, array: np.ndarray, root: int = 0) -> None:
        _check_array(array, "broadcast")
        _check_root(root, self.size)
        self.comm.Bcast(array, root=root)

    def barrier(self) -> None:
        self.comm.Barrier()
