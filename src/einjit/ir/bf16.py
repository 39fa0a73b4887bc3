"""bfloat16 storage in NumPy: the reference semantics every backend's bf16 loads and stores
follow (NumPy has no bfloat16 type, and einjit requires nothing beyond NumPy).

A bf16 cell is the upper 16 bits of a float32, kept as a `uint16` bit pattern. Loading widens
exactly (the pattern shifted into the upper half); storing rounds a float32 to nearest, ties to
even, as the C helpers and `vcvtneps2bf16` do. A NaN stays a NaN (its quiet bit is set, so the
rounding carry cannot turn it into an infinity); infinities and signed zeros are kept; subnormals
are rounded like any other value (no flush to zero).
"""

from __future__ import annotations

import struct

import numpy as np

from einjit.ir import ops

__all__ = ["as_cells", "as_values", "cell_from_bits", "cell_to_bits", "from_bits", "round_to_bf16", "to_bits"]


def to_bits(values: object) -> np.ndarray:
    """The bf16 bit patterns (uint16) of `values`, converted to float32 first, rounded to
    nearest even."""
    f = np.asarray(values, dtype=np.float32)
    u = f.view(np.uint32).astype(np.uint64)
    rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16
    nan = (u & 0x7FFFFFFF) > 0x7F800000
    return np.where(nan, (u >> 16) | 0x40, rounded).astype(np.uint16)


def from_bits(bits: object) -> np.ndarray:
    """The float32 values of bf16 bit patterns (exact)."""
    b = np.asarray(bits, dtype=np.uint16)
    return (b.astype(np.uint32) << 16).view(np.float32)


def cell_to_bits(value: float) -> np.uint16:
    """`to_bits` of one number, without array overhead (the interpreter stores one cell at a
    time)."""
    u = struct.unpack("<I", struct.pack("<f", value))[0]
    if (u & 0x7FFFFFFF) > 0x7F800000:
        return np.uint16((u >> 16) | 0x40)
    return np.uint16((u + 0x7FFF + ((u >> 16) & 1)) >> 16)


def cell_from_bits(bits: int | np.integer) -> np.float32:
    """`from_bits` of one cell."""
    return np.float32(struct.unpack("<f", struct.pack("<I", int(bits) << 16))[0])


def round_to_bf16(values: object) -> np.ndarray:
    """`values` rounded to the nearest bf16 number, as float32: what storing them in a bf16
    tensor and reading them back gives."""
    return from_bits(to_bits(values))


def as_cells(values: object, prec: ops.Prec) -> np.ndarray:
    """`values` as the cells of an array of `prec` (a new contiguous array unless they already
    are): their bit patterns for bf16, the values converted to `prec`'s dtype otherwise."""
    if prec is ops.bf16:
        return to_bits(values)
    return np.ascontiguousarray(values, dtype=prec.dtype)


def as_values(cells: np.ndarray, prec: ops.Prec) -> np.ndarray:
    """The values an array of `prec` holds, for the host to read: float32 copies for bf16
    (whose cells are bit patterns, garbage as numbers), `cells` itself otherwise. Every path
    that hands a node's cells to a user (a step's outputs, printing, export) goes through it."""
    return from_bits(cells) if prec is ops.bf16 else cells
