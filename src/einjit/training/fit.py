"""Routines that run many times on new data: a training step, a forward pass, and the loops.

`train_step(loss, update, inputs=...)` compiles forward + backprop + update once; `forward_step
(outputs, inputs=...)` compiles the forward pass of any tensors once. Calling a step writes
one NumPy array into each of its `ej.input` tensors and runs the routine, so training over a
data set, evaluation and prediction on new samples never recompile.

A forward step *recomputes* its outputs from parameters and inputs, even when their code was
already compiled into a training step (the seed consumes a subtree's code once, so the same
graph could otherwise not be run forward after training). It does not consume the code, so
a training step compiled afterwards still computes the whole forward pass itself.

The five-line loop `fit` wraps, for a model `mlp` and a hinge loss:

    x, y = ej.input("x", batch_dims=[64], output_dims=[2]), ej.input("y", batch_dims=[64])
    loss = ej.mean(ej.relu(1 - y * mlp(x)))
    train.init_params(loss, seed=0)
    step = fit.train_step(loss, train.sgd_update(loss, 0.1), inputs=[x, y])
    for xb, yb in data.Loader(X, Y, batch_size=64):   # one epoch, shuffled
        step(xb, yb)
"""

from __future__ import annotations

import functools
import sys
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from einjit.backends.interface import context_lock
from einjit.ir import assignments as asg
from einjit.ir import bf16, ops
from einjit.ir.tnode import Tnode
from einjit.tensor.inputs import input as new_input
from einjit.tensor.notation import Code, as_asgns
from einjit.tensor.state import drivers
from einjit.tensor.tensor import Tensor, TensorError, computes_in_host_array
from einjit.training import data, train
from einjit.training.step import forward_code, to_routine

Update = Code | asg.Asgns


def _not_inputs(inputs: Sequence[Tensor]) -> list[str]:
    return [t.describe() for t in inputs if t.op_label != "input"]


def _check_params_set(tensors: Iterable[Tensor]) -> None:
    """Compiling with a parameter that has no values would silently train or predict from
    zeros (the context allocates zeroed arrays), so it is refused."""
    missing = sorted({p.label_str for t in tensors for p in t.params() if p.value_tn.array is None})
    if missing:
        raise TensorError(f"einjit: parameters {missing} have no values yet: call train.init_params(loss, seed=...) "
                          f"or einjit.load(...) before compiling")


def _nothing() -> None:
    pass


def _transfer(routine: object, tn: Tnode, direction: str) -> Callable[[], None]:
    """The host transfer of `tn` for the context `routine` runs in, bound once: steps write
    their inputs before every run and read their outputs after, in their own context, so the
    per-step cost is one call — none when the context computes in the host arrays."""
    context = getattr(routine, "context", None)
    if context is None:
        return _nothing
    if computes_in_host_array(context, tn):
        return _nothing
    return functools.partial(getattr(context, direction), tn)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


class Step:
    """A routine compiled once and the input tensors it reads, in call-argument order."""

    def __init__(self, routine: Callable[[], None], inputs: Sequence[Tensor], name: str):
        bad = _not_inputs(inputs)
        if bad:
            raise TensorError(f"einjit: {name}: {bad} are not ej.input tensors; only inputs are written per call")
        self.routine, self.inputs, self.name = routine, tuple(inputs), name
        self._hosts = tuple(t.value_tn.host_array() for t in self.inputs)
        self._push = tuple(_transfer(routine, t.value_tn, "from_host") for t in self.inputs)
        self._squeezed = tuple(_squeezed(h.shape) for h in self._hosts)
        self._bf16 = tuple(t.value_tn.prec is ops.bf16 for t in self.inputs)
        self._fast_dtypes: tuple[set[np.dtype], ...] = tuple(set() for _ in self.inputs)

    def _fits(self, k: int, arr: object) -> bool:
        """Whether `arr` can be copied straight into input `k`: an array of its dims (up to
        axes of size 1) whose dtype `set_values` accepts (remembered once checked). A bf16
        input's cells are uint16 bit patterns: what it accepts is what float32 does."""
        if type(arr) is not np.ndarray:
            return False
        host = self._hosts[k]
        if arr.shape != host.shape and (arr.size != host.size or _squeezed(arr.shape) != self._squeezed[k]):
            return False
        if arr.dtype in self._fast_dtypes[k]:
            return True
        if arr.dtype.kind in "biuf" and np.can_cast(arr.dtype, self.inputs[k].dtype, casting="same_kind"):
            self._fast_dtypes[k].add(arr.dtype)
            return True
        return False

    def write(self, *arrays: np.ndarray) -> None:
        """Write one array per input, in place: copied straight in when it fits the input (a
        data loader's batches), else through `set_values`, which explains what is wrong."""
        if len(arrays) != len(self.inputs):
            raise TensorError(f"einjit: {self.name} takes {len(self.inputs)} arrays (for "
                              f"{[t.label_str for t in self.inputs]}), got {len(arrays)}")
        for k, arr in enumerate(arrays):
            if self._fits(k, arr):
                host = self._hosts[k]
                values = arr if arr.shape == host.shape else arr.reshape(host.shape)
                if self._bf16[k]:
                    host[...] = bf16.to_bits(values)
                else:
                    np.copyto(host, values, casting="same_kind")
                self._push[k]()
            else:
                self.inputs[k].set_values(arr)

    def __call__(self, *arrays: np.ndarray) -> None:
        with context_lock(getattr(self.routine, "context", None)):
            self.write(*arrays)
            self.routine()


class TrainStep(Step):
    """`step(*batch)`: one training step on a batch; `step.loss_value()` reads the loss.

    Before each run it calls `before_run` — the optimizers whose learning rate the step reads
    advance their schedules — so every loop over the step, `fit.fit` or a hand-written one,
    follows the schedules it was configured with."""

    def __init__(self, routine: Callable[[], None], inputs: Sequence[Tensor], name: str, loss: Tensor,
                 before_run: Sequence[Callable[[], None]] = ()):
        super().__init__(routine, inputs, name)
        self.loss = loss
        self._loss_cell = loss.value_tn.host_array().reshape(-1)
        self._loss_prec = loss.value_tn.prec
        self._pull = _transfer(routine, loss.value_tn, "to_host")
        self.before_run = tuple(before_run)

    def __call__(self, *arrays: np.ndarray) -> None:
        self.write(*arrays)
        for f in self.before_run:
            f()
        self.routine()

    def loss_value(self) -> float:
        self._pull()
        return float(bf16.as_values(self._loss_cell[:1], self._loss_prec)[0])


class ForwardStep(Step):
    """`step(*batch)` runs the forward pass and returns copies of the outputs (one array for
    one output, else a tuple): their values, so a bf16 output is read as float32, as
    `Tensor.numpy()` reads it (its cells are bit patterns)."""

    def __init__(self, routine: Callable[[], None], inputs: Sequence[Tensor], name: str,
                 outputs: Sequence[Tensor]):
        super().__init__(routine, inputs, name)
        self.outputs = tuple(outputs)
        self._pulls = tuple(_transfer(routine, t.value_tn, "to_host") for t in self.outputs)
        self._out_hosts = tuple(t.value_tn.host_array() for t in self.outputs)
        self._out_bf16 = tuple(t.value_tn.prec is ops.bf16 for t in self.outputs)

    def __call__(self, *arrays: np.ndarray):
        """Write, run and copy the outputs as one turn of the context's lock (`context_lock`):
        threads calling one step with their own inputs each get their own outputs."""
        with context_lock(getattr(self.routine, "context", None)):
            super().__call__(*arrays)
            for pull in self._pulls:
                pull()
            outs = tuple(bf16.from_bits(host) if wide else host.copy()
                         for host, wide in zip(self._out_hosts, self._out_bf16, strict=True))
        return outs[0] if len(outs) == 1 else outs


def forward_step(outputs: Tensor | Sequence[Tensor], *, inputs: Sequence[Tensor], name: str = "forward",
                 backend: object = None, context: object = None) -> ForwardStep:
    """Compile (once) a routine computing `outputs` from the inputs' current values (on
    `backend` / in `context` as `to_routine` takes them; default: the C backend's context
    computing in the host arrays). An output that a routine compiled before keeps only inside
    itself is read through a copy (`train.readable`)."""
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    _check_params_set(outs)
    outs = [train.readable(t) for t in outs]
    routine = to_routine(forward_code(*outs), name=name, backend=backend, context=context)
    return ForwardStep(routine, inputs, name, outs)


_predictors: weakref.WeakKeyDictionary[Callable, dict[tuple, ForwardStep]] = weakref.WeakKeyDictionary()


def predictor(model: Callable[[Tensor], Tensor], *, batch_dims: Sequence[int] = (1,), input_dims: Sequence[int] = (),
              output_dims: Sequence[int] = (1,), prec: ops.Prec | str | np.dtype | type | None = None) -> ForwardStep:
    """The forward step of `model` (an `@ej.op` function of one tensor) on inputs of these
    dims: built and compiled on the first request, the same step for every later one, so
    predicting after training never recompiles: `predictor(mlp, output_dims=[2])(sample)`."""
    key = (tuple(batch_dims), tuple(input_dims), tuple(output_dims), None if prec is None else ops.as_prec(prec))
    steps = _predictors.setdefault(model, {})
    step = steps.get(key)
    if step is None:
        name = getattr(model, "__name__", "model")
        x = new_input(f"{name}_input", batch_dims=batch_dims, input_dims=input_dims, output_dims=output_dims,
                      prec=prec)
        step = steps[key] = forward_step(model(x), inputs=[x], name=f"predict_{name}")
    return step


def train_step(loss: Tensor, update: Update | list[Update] | tuple[Update, ...], *, inputs: Sequence[Tensor],
               name: str = "train_step", backend: object = None, context: object = None,
               mixed_precision: str | None = None) -> TrainStep:
    """Compile (once) forward, backprop and `update` (e.g. `train.sgd_update(loss, lr)`, or a
    list of per-parameter updates such as `train.sgd_one`'s); `backend` / `context` as for
    `forward_step`. `mixed_precision="bf16"` computes forward and backprop on bf16 weight
    copies and activations, keeping float32 parameters, gradients and optimizer state
    (`train.grad_update`)."""
    _check_params_set([loss])
    updates: list[Update] = list(update) if isinstance(update, (list, tuple)) else [update]
    code = asg.sequence(train.grad_update(loss, mixed_precision=mixed_precision), *[as_asgns(u) for u in updates])
    routine = to_routine(code, name=name, backend=backend, context=context)
    return TrainStep(routine, inputs, name, loss, drivers(code))


# ---------------------------------------------------------------- loops


def _progress_bar(total: int, progress: bool | None, desc: str):
    """tqdm when wanted: `None` uses it if installed; `True` requires the `progress` extra."""
    if progress is False:
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        if progress:
            raise TensorError("einjit: a progress bar needs tqdm: pip install 'einjit[progress]'") from None
        return None
    return tqdm(total=total, desc=desc, unit="batch", file=sys.stderr, leave=False)


@dataclass
class History:
    """Mean training loss per epoch, and the seconds each epoch took."""

    losses: list[float] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


class _Gather:
    """Runs `step` on a loader's batch by gathering the batch's rows straight into the host
    arrays of the inputs (`np.take(..., out=)`): no batch array is allocated or copied twice,
    which keeps per-step host writes close to the cost of data already on the device."""

    def __init__(self, step: Step, loader: data.Loader):
        n_arrays = len(loader.arrays) + (1 if loader.weights else 0)
        if n_arrays != len(step.inputs):
            raise TensorError(f"einjit: {step.name} takes {len(step.inputs)} arrays (for "
                              f"{[t.label_str for t in step.inputs]}) but the loader yields {n_arrays}")
        self.step, self.loader, self.routine = step, loader, step.routine
        self.before_run = step.before_run if isinstance(step, TrainStep) else ()
        self.size = step._hosts[0].shape[0] if step._hosts[0].ndim else 1
        self.writers = [self._writer(k, a) for k, a in enumerate(loader.arrays)]
        self.weights = self._writer(len(step.inputs) - 1, None) if loader.weights else None

    def _writer(self, k: int, a: np.ndarray | None) -> Callable[[np.ndarray], None]:
        """Writes input `k` from the batch's rows of `a` (from the weights when `a` is None);
        a bf16 input through `set_values`, which rounds the values into bit patterns."""
        t, host, push = self.step.inputs[k], self.step._hosts[k], self.step._push[k]
        if self.step._bf16[k]:
            return t.set_values if a is None else lambda rows: t.set_values(a.take(rows, axis=0))
        if a is None:
            if host.size != self.size:
                return lambda w: t.set_values(w)
            flat = host.reshape(-1)
            fill = functools.partial(np.copyto, flat, casting="same_kind")
        else:
            shape = (self.size, *a.shape[1:])
            if a.dtype != host.dtype or int(np.prod(shape)) != host.size or _squeezed(shape) != _squeezed(host.shape):
                return lambda rows: t.set_values(a.take(rows, axis=0))
            fill = functools.partial(a.take, axis=0, out=host.reshape(shape), mode="clip")
        if push is _nothing:
            return fill

        def write(rows: np.ndarray) -> None:
            fill(rows)
            push()

        return write

    def __call__(self, rows: np.ndarray, real: int) -> None:
        if len(rows) != self.size:
            self.step(*self.loader.batch(rows, real))
            return
        for write in self.writers:
            write(rows)
        if self.weights is not None:
            self.weights(self.loader.row_weights(real))
        for f in self.before_run:
            f()
        self.routine()


def fit(step: TrainStep, loader: data.Loader, *, epochs: int, start_epoch: int = 0, progress: bool | None = None,
        on_epoch: Callable[[int, float], None] | None = None) -> History:
    """Train `epochs` epochs (numbered from `start_epoch`, which fixes their shuffles, so a
    resumed run repeats exactly the batches of an uninterrupted one). Every step advances the
    learning-rate schedules of the optimizers it updates with. A loader that yields no batch
    is refused: an epoch without a step would report a loss of 0 for training nothing."""
    if len(loader) == 0:
        raise data.DataError(f"einjit: the loader yields no batch: {loader.n} rows, batch_size {loader.batch_size}"
                             f"{', drop_last=True drops them all' if loader.drop_last else ''}; nothing to train on")
    history = History()
    for epoch in range(start_epoch, start_epoch + epochs):
        bar = _progress_bar(len(loader), progress, f"epoch {epoch + 1}")
        start, total, count = time.perf_counter(), 0.0, 0
        gather = _Gather(step, loader)
        for rows, real in loader.index_batches(epoch):
            gather(rows, real)
            total += step.loss_value()
            count += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{total / count:.4f}", refresh=False)
        if bar is not None:
            bar.close()
        history.losses.append(total / max(1, count))
        history.seconds.append(time.perf_counter() - start)
        if on_epoch is not None:
            on_epoch(epoch, history.losses[-1])
    return history


def predict(step: ForwardStep, *arrays: np.ndarray) -> np.ndarray:
    """The first output of `step` for every row of `arrays`, in batches of the inputs' batch
    size (the last one padded by repeating rows, its padding results dropped)."""
    if len(step.outputs) != 1:
        raise TensorError(f"einjit: predict needs a forward step with one output, {step.name} has {len(step.outputs)}")
    if len(arrays) != len(step.inputs):
        raise TensorError(f"einjit: predict: {step.name} takes {len(step.inputs)} arrays (for "
                          f"{[t.label_str for t in step.inputs]}), got {len(arrays)}")
    if not step.inputs:
        raise TensorError(f"einjit: predict: {step.name} has no inputs to batch over; call the step itself")
    batch = step.inputs[0].dims[0] if step.inputs[0].dims else 1
    out = step.outputs[0]
    if not out.dims or out.dims[0] != batch:
        raise TensorError(f"einjit: predict: the output {out.describe()} of dims {out.dims} has no leading batch axis "
                          f"of the inputs' batch size {batch}")
    n = len(arrays[0])
    results = []
    for chunk in data.batches(arrays, batch):
        rows = len(chunk[0])
        if rows < batch:
            chunk = tuple(np.concatenate([a, np.resize(a, (batch - rows, *a.shape[1:]))]) for a in chunk)
        results.append(step(*chunk)[:rows])
    return np.concatenate(results)[:n] if results else np.zeros((0, *out.dims[1:]), out.dtype)


def evaluate(step: ForwardStep, inputs: Sequence[np.ndarray], targets: np.ndarray,
             metric: Callable[[np.ndarray, np.ndarray], float]) -> float:
    """`metric(predictions, targets)` over held-out data, predicted in batches."""
    return float(metric(predict(step, *inputs), np.asarray(targets)))
