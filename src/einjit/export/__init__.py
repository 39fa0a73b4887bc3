"""Deploying trained models: a dependency-free C library (`export_c`), ONNX out (`export_onnx`)
and ONNX in (`onnx_load`).

The package sits above training and the backends in the import order: it lowers a forward
step with the same lowering and renderer the C backend uses (`c_library`), and walks the tensor
graph for ONNX (`onnx_out`, `onnx_in`). The `onnx` package is needed only for ONNX, as the
optional extra `onnx`; the names below load their module on first use, so `export_c` works
without it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from einjit.export.errors import ExportError

if TYPE_CHECKING:
    from einjit.export.c_library import CLibrary as CLibrary
    from einjit.export.c_library import export_c as export_c
    from einjit.export.onnx_in import OnnxModel as OnnxModel
    from einjit.export.onnx_in import onnx_load as onnx_load
    from einjit.export.onnx_out import export_onnx as export_onnx

__all__ = ["CLibrary", "ExportError", "OnnxModel", "export_c", "export_onnx", "onnx_load"]

_LAZY = {"CLibrary": "c_library", "export_c": "c_library", "OnnxModel": "onnx_in", "onnx_load": "onnx_in",
         "export_onnx": "onnx_out"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'einjit.export' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"einjit.export.{module}"), name)
    globals()[name] = value
    return value
