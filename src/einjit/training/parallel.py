"""Data-parallel training: one training step split over several replicas of the model.

A step is split in two compiled routines: the *gradient* routine (forward, zero gradients,
backprop; `train.grad_update`) that every replica runs on its own shard of the batch, and the
*update* routine (e.g. `train.sgd_update`) that runs on the summed gradients. Both are
compiled once, relocatably (`shared=True`), and linked into every replica's context.

Shards are chosen with one static symbol, `shard` (the batch index of a dataset sliced with
`batch_slice`): when the caller's binding of `shard` holds `v`, replica `r` of `n` computes on
shard `n * v + r`, so one step covers the union batch of shards `n*v .. n*v + n-1`. Summing the
replicas' gradients gives the gradient of the union batch only when the loss is normalized by
the union batch size (`n` times a replica's batch): then n-replica training equals one-replica
training on the union batch, up to the rounding of the order of summation.

Two ways of summing:

- `DataParallel` — devices of one backend (`MulticoreBackend`). Every device runs the gradient
  routine; each other device's gradients are copied into device 0's merge buffers
  (`device_to_device(..., into_merge_buffer=True)`) and added by one merge routine per
  parameter (`g =+ g.merge`: a routine reads at most one merge buffer), copy and merge in
  turn, once per source device, because a context has one merge buffer per node. Device 0 runs
  the update, and the parameters are copied back into every other device's arrays
  (`into_merge_buffer=False`). Nothing in a step waits: every transfer is a pair of works on
  the two device queues, so device 0's merge runs after device d's gradients are done, the
  next copy into a merge buffer after the merge that read it, and device d's next gradients
  after its parameters arrived.
- `CommDataParallel` — ranks joined by a `Communicator` (threads in one process, or MPI
  processes). Each rank runs both routines in its own context of a no-device backend; between
  them the gradients (and the loss) are all-reduced in place, so every rank applies the same
  update and the replicas stay equal without sending parameters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from einjit import backends
from einjit.backends.interface import BackendUsageError, Compiled, load_inputs
from einjit.ir import assignments as asg
from einjit.ir import bf16, ops
from einjit.ir.indexing import IntRef, StaticSymbol
from einjit.ir.naming import stable_names
from einjit.ir.tnode import Tnode
from einjit.tensor.notation import Code, as_asgns, cd
from einjit.tensor.state import drivers
from einjit.tensor.tensor import Tensor, TensorError
from einjit.training import train
from einjit.training.comm import Communicator
from einjit.training.step import compile_code

__all__ = ["CommDataParallel", "DataParallel", "StepCode", "comm_parallel_update", "compile_step", "parallel_update"]

Bindings = Mapping[StaticSymbol, IntRef] | Sequence[StaticSymbol]


@dataclass(frozen=True, eq=False)
class StepCode:
    """A training step compiled for data parallelism: `grad` for every replica, `update` for
    the summed gradients; both take the static symbols `bindings` (which include `shard`)."""

    loss: Tensor
    params: tuple[Tensor, ...]
    grad: Compiled
    update: Compiled
    bindings: tuple[StaticSymbol, ...]
    shard: StaticSymbol
    name: str
    before_update: tuple[Callable[[], None], ...] = ()


def _refs(bindings: Bindings) -> dict[StaticSymbol, IntRef]:
    return dict(bindings) if isinstance(bindings, Mapping) else {s: IntRef(0) for s in bindings}


def compile_step(backend: Any, loss: Tensor, update_code: "Code | asg.Asgns", *, bindings: Sequence[StaticSymbol],
                 shard: StaticSymbol, name: str = "data_parallel") -> StepCode:
    """Compile `grad_update(loss)` and `update_code` separately, relocatably, with `backend`
    (through `step.compile_code`, the compile path of every training step)."""
    params = tuple(loss.params())
    if not params:
        raise TensorError(f"einjit: data parallelism needs parameters; loss {loss.label_str} has none")
    symbols = tuple(dict.fromkeys([*bindings, shard]))
    grad = compile_code(train.grad_update(loss), bindings=symbols, name=f"{name}_grad", backend=backend).compiled
    update = compile_code(update_code, bindings=symbols, name=f"{name}_update", backend=backend).compiled
    return StepCode(loss, params, grad, update, symbols, shard, name, tuple(drivers(as_asgns(update_code))))


def _shard_values(code: StepCode, given: Mapping[StaticSymbol, IntRef], mine: Mapping[StaticSymbol, IntRef],
                  replicas: int, replica: int) -> None:
    """Copy the caller's static values into one replica's refs, choosing its shard."""
    for s, ref in mine.items():
        if s in given:
            ref.value = given[s].value
    mine[code.shard].value = replicas * given[code.shard].value + replica


# ---------------------------------------------------------------- devices of one backend


class DataParallel:
    """Data-parallel training over `num_devices` devices of a device backend (see the module).

    Set the caller's `bindings` (the shard symbol's union-batch index, a step counter, ...) and
    call `step()` to schedule one step; `sync()` makes the parameters and the devices' losses
    readable on the host and reports any failure. Each `step()` advances the learning-rate
    schedules of the optimizers whose update it runs, as a `fit.train_step` does.
    """

    def __init__(self, loss: Tensor, update_code: "Code | asg.Asgns", *, num_devices: int, bindings: Bindings,
                 shard: StaticSymbol, backend: Any = None, name: str = "data_parallel"):
        if num_devices < 1:
            raise BackendUsageError(f"einjit: data parallelism needs at least one device, got {num_devices}")
        self._owns_backend = backend is None
        if backend is None:
            from einjit.backends.cc.multicore import MulticoreBackend
            backend = MulticoreBackend(num_devices=num_devices)
        if backend.num_devices() < num_devices:
            raise BackendUsageError(f"einjit: backend {backend.name} has {backend.num_devices()} devices, "
                             f"{num_devices} requested")
        self.backend = backend
        self.num_devices = num_devices
        self.bindings = _refs(bindings)
        if shard not in self.bindings:
            self.bindings[shard] = IntRef(0)
        self.code = compile_step(backend, loss, update_code, bindings=tuple(self.bindings), shard=shard, name=name)
        params = self.code.params
        with stable_names() as names:
            merge_names = [f"{name}_merge_{names.node(p.grad_tn)}" for p in params]
        merge_codes = backend.compile_batch((), [cd("g =+ g.merge", g=p.grad).asgns for p in params], shared=True,
                                            names=merge_names)

        self.devices = [backend.get_device(d) for d in range(num_devices)]
        self.contexts = [backend.init(device) for device in self.devices]
        self._grads = []
        for ctx in self.contexts:
            load_inputs(ctx, self.code.grad.inputs)
            self._grads.append(backend.link(ctx, self.code.grad, {s: IntRef(0) for s in self.code.bindings}))
        ctx0 = self.contexts[0]
        for code in merge_codes:
            load_inputs(ctx0, code.inputs)
        self._merges = backend.link_batch(ctx0, merge_codes)
        load_inputs(ctx0, self.code.update.inputs)
        self._update = backend.link(ctx0, self.code.update, self.bindings)

    def __repr__(self) -> str:
        return f"<DataParallel {self.code.name} over {self.num_devices} devices of {self.backend.name}>"

    def __enter__(self) -> "DataParallel":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def params(self) -> tuple[Tensor, ...]:
        return self.code.params

    def step(self) -> None:
        """Schedule one step on the devices; never blocks (see the module for the ordering)."""
        be, ctx0 = self.backend, self.contexts[0]
        for d, routine in enumerate(self._grads):
            _shard_values(self.code, self.bindings, routine.bindings, self.num_devices, d)
            routine()
        for ctx in self.contexts[1:]:
            for p, merge in zip(self.code.params, self._merges, strict=True):
                be.device_to_device(p.grad_tn, ctx0, ctx, into_merge_buffer=True)
                merge()
        for advance in self.code.before_update:
            advance()
        self._update()
        for ctx in self.contexts[1:]:
            for p in self.code.params:
                be.device_to_device(p.value_tn, ctx, ctx0, into_merge_buffer=False)

    def losses(self) -> list[float]:
        """Each device's loss of the last step, waiting for it (a device's shard of the union
        loss: they add up to the union batch's loss)."""
        out = []
        tn = self.code.loss.value_tn
        for ctx in self.contexts:
            self.backend.to_host(ctx, tn)
            out.append(float(bf16.as_values(tn.host_array().reshape(-1)[:1], tn.prec)[0]))
        return out

    def sync(self) -> list[float]:
        """Wait for the scheduled steps, copy the parameters from device 0 to the host, raise the
        first failure of any device; return the devices' losses of the last step."""
        for p in self.code.params:
            self.backend.to_host(self.contexts[0], p.value_tn)
        losses = self.losses()
        for device in self.devices:
            self.backend.await_(device)
        return losses

    def close(self) -> None:
        """Stop the devices when this object created the backend."""
        if self._owns_backend:
            self.backend.shutdown()


def parallel_update(loss: Tensor, update_code: "Code | asg.Asgns", *, num_devices: int, bindings: Bindings,
                    shard: StaticSymbol, backend: Any = None, name: str = "data_parallel") -> DataParallel:
    """Data-parallel training of `loss` with `update_code` over `num_devices` devices (by default
    of a fresh `MulticoreBackend`): see `DataParallel`. Normalize the loss by the union batch."""
    return DataParallel(loss, update_code, num_devices=num_devices, bindings=bindings, shard=shard,
                        backend=backend, name=name)


# ---------------------------------------------------------------- ranks joined by a communicator


class CommDataParallel:
    """One rank's replica for data parallelism over a `Communicator`.

    The replica owns a context of a no-device backend (by default `CcBackend`) whose arrays it
    all-reduces directly, so ranks that are threads of one process, sharing the tensors' host
    arrays, do not race. All gradients and the loss travel in one buffer per dtype: one
    collective per step. After `step()`, `loss()` is the union batch's loss on every rank.
    Unlike `DataParallel.step()`, `step()` does not advance the update's learning-rate
    schedules, since ranks that are threads share one optimizer: call `opt.step()` once per
    step in every process (once in all for thread ranks), before the ranks' `step()`.
    """

    def __init__(self, code: StepCode, comm: Communicator, *, backend: Any = None,
                 bindings: Mapping[StaticSymbol, IntRef] | None = None):
        backend = backends.resolve(backend or "cc")
        self.code, self.comm, self.backend = code, comm, backend
        self.bindings = {s: IntRef(0) for s in code.bindings} | dict(bindings or {})
        self.context = backend.init(f"rank{comm.rank}")
        if not hasattr(self.context, "array"):
            raise TypeError(f"einjit: a communicator replica all-reduces its context's arrays in place and needs a "
                            f"no-device CPU backend (CcBackend), not {backend!r}")
        load_inputs(self.context, code.grad.inputs)
        self._grad = backend.link(self.context, code.grad, {s: IntRef(0) for s in code.bindings})
        load_inputs(self.context, code.update.inputs)
        self._update = backend.link(self.context, code.update, self.bindings)
        grads: list[Tnode] = []
        for p in code.params:
            assert p.grad_tn is not None  # the trained parameters are differentiable
            grads.append(p.grad_tn)
        self._packs = _packs(grads + [code.loss.value_tn], self.array)

    def __repr__(self) -> str:
        return f"<CommDataParallel {self.code.name} rank {self.comm.rank} of {self.comm.size}>"

    @property
    def params(self) -> tuple[Tensor, ...]:
        return self.code.params

    def array(self, tn: Tnode) -> np.ndarray:
        """This rank's array of `tn` (the context's, not the host's)."""
        return self.context.array(tn)

    def broadcast_params(self, root: int = 0) -> None:
        """Give every rank the root's parameters (collective): replicas start equal."""
        for p in self.code.params:
            self.comm.broadcast(self.array(p.value_tn), root)

    def step(self) -> None:
        """Gradients on this rank's shard, all-reduced, then the update (collective)."""
        _shard_values(self.code, self.bindings, self._grad.bindings, self.comm.size, self.comm.rank)
        self._grad()
        for pack in self._packs:
            pack.allreduce(self.comm)
        self._update()

    def loss(self) -> float:
        """The union batch's loss of the last step."""
        loss = self.code.loss.value_tn
        return float(bf16.as_values(self.array(loss).reshape(-1)[:1], loss.prec)[0])

    def param_values(self) -> list[np.ndarray]:
        """Copies of this rank's parameters."""
        return [np.array(bf16.as_values(self.array(p.value_tn), p.value_tn.prec)) for p in self.code.params]

    def sync(self) -> None:
        """Copy this rank's parameters to the host arrays (call it on one rank per process)."""
        for p in self.code.params:
            self.backend.to_host(self.context, p.value_tn)


@dataclass(frozen=True)
class _Pack:
    """Nodes of one precision, all-reduced as one flat buffer (one collective per precision, not
    per node). bf16 cells are uint16 bit patterns, which no communicator can add: they travel
    widened to float32 and are rounded back once, after the sum, so every rank rounds the same
    float32 total."""

    prec: ops.Prec
    buffer: np.ndarray
    parts: tuple[tuple[np.ndarray, slice], ...]

    def allreduce(self, comm: Communicator) -> None:
        for flat, where in self.parts:
            self.buffer[where] = bf16.as_values(flat, self.prec)
        comm.allreduce(self.buffer)
        for flat, where in self.parts:
            flat[...] = bf16.as_cells(self.buffer[where], self.prec)


def _packs(tns: Sequence[Tnode], array: Any) -> list[_Pack]:
    by_prec: dict[ops.Prec, list[np.ndarray]] = {}
    for tn in tns:
        by_prec.setdefault(tn.prec, []).append(array(tn).reshape(-1))
    packs = []
    for prec, flats in by_prec.items():
        parts, offset = [], 0
        for flat in flats:
            parts.append((flat, slice(offset, offset + flat.size)))
            offset += flat.size
        dtype = np.float32 if prec is ops.bf16 else prec.dtype
        packs.append(_Pack(prec, np.zeros(offset, dtype=dtype), tuple(parts)))
    return packs


def comm_parallel_update(loss: Tensor, update_code: "Code | asg.Asgns", *, comm: Communicator, bindings: Bindings,
                         shard: StaticSymbol, backend: Any = None, name: str = "data_parallel") -> CommDataParallel:
    """Compile the step and make this rank's replica (one rank per process, e.g. under MPI);
    the caller's `bindings` refs drive it. Ranks sharing a process share one `compile_step`."""
    backend = backends.resolve(backend or "cc")
    refs = _refs(bindings)
    refs.setdefault(shard, IntRef(0))
    code = compile_step(backend, loss, update_code, bindings=tuple(refs), shard=shard, name=name)
    return CommDataParallel(code, comm, backend=backend, bindings=refs)
