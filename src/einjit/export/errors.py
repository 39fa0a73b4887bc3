"""The one error of `einjit.export`: a model, a file or an option that cannot be exported or
imported. The message names the tensor, node, operator or file involved."""

from __future__ import annotations

from einjit.errors import EinjitError


class ExportError(EinjitError, ValueError):
    """A model that cannot be written as C or ONNX, or an ONNX file that cannot be read."""
