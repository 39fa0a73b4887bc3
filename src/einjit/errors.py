"""The root of every exception einjit raises on purpose.

Each layer keeps its own exception classes (shape, lowering, backend, notation, ...), so
messages stay close to the code that knows what went wrong. They all derive from
`EinjitError` too, so a user can catch "anything einjit refused" in one clause without
catching Python's own errors, which would hide real bugs. This module imports nothing.
"""

from __future__ import annotations


class EinjitError(Exception):
    """Bad input or misuse that einjit detected; the message says what and where."""
