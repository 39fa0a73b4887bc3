"""The backend registry: `get(name)` returns the process's backend of that name.

A backend is one module plus one entry in `_FACTORIES`. Without a name, `get()` reads
`$EINJIT_BACKEND` and falls back to `cc`, the C backend on the CPU. Backends are made on first
use and kept, so every `train.to_routine` of a process shares one backend's devices.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

from einjit.errors import EinjitError

__all__ = ["UnknownBackendError", "get", "names", "resolve", "with_options"]


class UnknownBackendError(EinjitError, ValueError):
    """A backend name that is not registered."""


def _cc() -> Any:
    from einjit.backends.cc.backend import CcBackend
    return CcBackend()


def _multicore() -> Any:
    from einjit.backends.cc.multicore import MulticoreBackend
    return MulticoreBackend(get("cc"))


def _cuda() -> Any:
    from einjit.backends.gpu.cuda import CudaBackend
    return CudaBackend()


_FACTORIES: dict[str, Callable[[], Any]] = {"cc": _cc, "multicore": _multicore, "cuda": _cuda}
_made: dict[str, Any] = {}
_lock = threading.RLock()


def names() -> list[str]:
    """The registered backend names."""
    return list(_FACTORIES)


def get(name: str | None = None) -> Any:
    """The backend called `name` (default: `$EINJIT_BACKEND`, else `cc`), made on first use."""
    name = name or os.environ.get("EINJIT_BACKEND") or "cc"
    factory = _FACTORIES.get(name)
    if factory is None:
        source = "" if os.environ.get("EINJIT_BACKEND") != name else " (from $EINJIT_BACKEND)"
        raise UnknownBackendError(f"einjit: no backend named {name!r}{source}; the backends are "
                                  f"{', '.join(map(repr, _FACTORIES))}")
    with _lock:
        if name not in _made:
            _made[name] = factory()
        return _made[name]


def with_options(backend: Any, options: Any) -> Any:
    """The C backend compiling with other `CcOptions`; its code links into `backend`'s contexts
    (contexts belong to a backend name)."""
    from einjit.backends.cc.backend import CcBackend
    from einjit.backends.interface import WrongBackendError
    if not isinstance(backend, CcBackend):
        raise WrongBackendError(f"einjit: options= are C compiler options (CcOptions) and apply to the C backend, "
                                f"not to backend {backend.name!r}; pass them to that backend's constructor instead")
    return CcBackend(options, name=backend.name)


def resolve(backend: Any = None) -> Any:
    """A backend object as given, or the registered backend of that name (None: the default)."""
    return backend if backend is not None and not isinstance(backend, str) else get(backend)
