"""The one exception of shape inference.

Every failure a user can cause — a bad spec, conflicting dimensions or labels, too many axes,
an element count that does not fit — surfaces as a `ShapeError` whose message names the shapes,
axis kinds, positions and values involved. Keeping it in its own module lets the parser, the
solver and the shape layer raise it without importing each other.
"""

from __future__ import annotations

from einjit.errors import EinjitError


class ShapeError(EinjitError):
    """A shape or projection inference failure, or a malformed einsum / shape spec."""
