"""Parser of the generalized einsum notation, and of the shape notation used for printing.

A *slot* describes one tensor's axes as `batch|input->output`, `input->output` or `output`;
rows that a slot does not mention have no axes. An einsum spec lines up slots:
`rhs1;rhs2=>lhs` (binary) or `rhs=>lhs` (unary) — the right-hand sides come first.

Axis entries are written in one of two modes, chosen for the whole spec:
- single-character mode (no comma anywhere): every letter is an axis, whitespace and
  parentheses are ignored, a digit is a fixed index — except that a row made of digits only is
  one fixed index (`"12"` is index 12, `"b00c"` is four axes);
- multi-character mode (a comma anywhere): entries are separated by commas, whitespace or
  parentheses, so `"height, width"` is two axes and `"abc,"` one.

Entries of an einsum row:
- an identifier: a pseudo-label, local to the spec, lining up axes across slots;
- digits: a fixed index into that axis (the axis is not iterated);
- `_`: an axis that lines up with nothing;
- `stride*i+dilation*j+offset` (multi-character mode only): a convolution-style axis indexed by
  an affine combination of other pseudo-labels. Coefficients are positive integers. A negative
  constant term is padding, as in seed 000's `Affine{offset = -padding}`: `o+k-1` reads one
  cell before the start and, symmetrically, one past the end; those reads give 0 (the lowering
  guards them) and the gradient never writes there. With padding `p`, stride `s`, dilation
  `d`, a kernel of `K` and an argument axis of `N`, the result axis has
  `(N + 2p - d*(K-1) - 1) // s + 1` cells, as in PyTorch's `Conv2d(padding=p)`: e.g.
  `"2*oh+kh-1, 2*ow+kw-1, c; kh, kw, c -> f => oh, ow, f"` is a 3x3 stride-2 "same" convolution.
  Padding that differs at the two ends (PyTorch's `F.pad(x, (left, right))`, or "same" for an
  even kernel) is written `-left:right`: `o+k-0:1` pads nothing before and one cell after (a
  2-tap "same" convolution), `2*o+k-1:2` one before and two after; the result axis then has
  `(N + left + right - d*(K-1) - 1) // s + 1` cells;
- `...` or `..name..`, only as the leftmost entry of a row: a row variable standing for any
  number of further (leading) axes. `...` means `..batch..`, `..input..` or `..output..`
  depending on the row it is in, so all `...` of one kind in a spec line up.

The shape notation (`Shape.of_spec`, and how shapes print) uses the same slot syntax, always in
multi-character mode, with entries `3` (a size), `rgb=3` (a labelled size), `_` (unknown) and
row variables for unknown further axes.

Numbers (fixed indices, coefficients, offsets, sizes) are ASCII digits only, at most
`MAX_NUMBER`; letters of pseudo-labels are ASCII too.

Errors raise `ShapeError` naming the spec and the 1-based column of the offending character.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from einjit.shape.errors import ShapeError

KINDS = ("batch", "input", "output")

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SEPARATORS = ",()"
MAX_NUMBER = 2**31 - 1
"""The largest number a spec may write: the generated code indexes with 32-bit ints at least."""


def _is_digits(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _is_word_char(ch: str) -> bool:
    return ch.isascii() and (ch.isalnum() or ch == "_")


def _number(src: _Source, text: str, pos: int) -> int:
    """`text` (ASCII digits) as an int, refused past `MAX_NUMBER` before converting it."""
    digits = text.lstrip("0") or "0"
    if len(digits) > len(str(MAX_NUMBER)) or int(digits) > MAX_NUMBER:
        shown = text if len(text) <= 20 else f"{text[:8]}...({len(text)} digits)"
        raise src.error(pos, f"number {shown} is too large: at most {MAX_NUMBER}")
    return int(digits)


@dataclass(frozen=True, slots=True)
class Label:
    """An axis lined up with all axes carrying the same pseudo-label in the spec."""

    name: str


@dataclass(frozen=True, slots=True)
class FixedIndex:
    """The axis is indexed at this position only."""

    index: int


@dataclass(frozen=True, slots=True)
class ConvAxis:
    """The axis is indexed by `sum(coeff * label) + offset` (e.g. `stride*o + dilation*k`).
    `right_padding`: the cells the index may run past the end (None: as many as before the
    start, `-offset`)."""

    terms: tuple[tuple[int, str], ...]
    offset: int = 0
    right_padding: int | None = None

    @property
    def padding(self) -> tuple[int, int]:
        """(before, after): the cells the index may run outside the axis at each end."""
        left = max(0, -self.offset)
        return left, left if self.right_padding is None else self.right_padding


@dataclass(frozen=True, slots=True)
class Anonymous:
    """`_`: an axis lined up with no other axis."""


AxisSpec = Label | FixedIndex | ConvAxis | Anonymous


@dataclass(frozen=True, slots=True)
class SizedAxis:
    """An entry of the shape notation: a size (None when unknown) and an optional label."""

    size: int | None
    label: str | None = None


@dataclass(frozen=True, slots=True)
class RowSpec:
    """One row of a slot: an optional row variable (leading axes) and the given axes;
    `column` is where the row starts in the spec text (0-based), for error messages."""

    row_var: str | None
    axes: tuple
    column: int = field(default=0, compare=False)


@dataclass(frozen=True, slots=True)
class SlotSpec:
    batch: RowSpec
    input: RowSpec
    output: RowSpec

    def row(self, kind: str) -> RowSpec:
        return getattr(self, kind)


@dataclass(frozen=True, slots=True)
class EinsumSpec:
    """A parsed `rhs=>lhs` or `rhs1;rhs2=>lhs` spec; `text` is the original string."""

    text: str
    rhs: tuple[SlotSpec, ...]
    lhs: SlotSpec


class _Source:
    """The text being parsed, for error messages that point at a column."""

    __slots__ = ("text", "what")

    def __init__(self, text: str, what: str):
        self.text, self.what = text, what

    def error(self, pos: int, message: str) -> ShapeError:
        return ShapeError(f'{self.what} "{self.text}": column {pos + 1}: {message}')


def _find_all(text: str, pattern: str, start: int, end: int) -> list[int]:
    found, i = [], text.find(pattern, start, end)
    while i >= 0:
        found.append(i)
        i = text.find(pattern, i + len(pattern), end)
    return found


def parse_einsum(text: str) -> EinsumSpec:
    """Parse `rhs=>lhs` or `rhs1;rhs2=>lhs`; the caller checks the number of argument slots."""
    src = _Source(text, "einsum spec")
    arrows = _find_all(text, "=>", 0, len(text))
    if not arrows:
        raise src.error(len(text.rstrip()), 'missing "=>": expected "rhs=>lhs" or "rhs1;rhs2=>lhs"')
    if len(arrows) > 1:
        raise src.error(arrows[1], 'more than one "=>"')
    arrow = arrows[0]
    semis = _find_all(text, ";", 0, len(text))
    if any(s > arrow for s in semis):
        raise src.error(next(s for s in semis if s > arrow), '";" separates argument slots, before "=>"')
    if len(semis) > 1:
        raise src.error(semis[1], "at most two argument slots: rhs1;rhs2=>lhs")
    multi = "," in text
    bounds = [0, *(s + 1 for s in semis)]
    ends = [*semis, arrow]
    rhs = tuple(_parse_slot(src, b, e, multi, _einsum_axis) for b, e in zip(bounds, ends, strict=True))
    lhs = _parse_slot(src, arrow + 2, len(text), multi, _einsum_axis)
    return EinsumSpec(text, rhs, lhs)


def parse_shape_spec(text: str) -> SlotSpec:
    """Parse the shape notation, e.g. `"2|3->rgb=3,4"` or `"...|_->10"`."""
    src = _Source(text, "shape spec")
    if "=>" in text or ";" in text:
        bad = min(i for i in (text.find("=>"), text.find(";")) if i >= 0)
        raise src.error(bad, 'a shape spec describes one shape: no "=>" or ";"')
    return _parse_slot(src, 0, len(text), True, _shape_axis)


def _parse_slot(src: _Source, start: int, end: int, multi: bool, entry) -> SlotSpec:
    text = src.text
    bars = _find_all(text, "|", start, end)
    arrows = _find_all(text, "->", start, end)
    if len(bars) > 1:
        raise src.error(bars[1], 'more than one "|" in a slot')
    if len(arrows) > 1:
        raise src.error(arrows[1], 'more than one "->" in a slot')
    if bars and arrows and arrows[0] < bars[0]:
        raise src.error(bars[0], '"|" (after the batch axes) must come before "->"')
    empty = (start, start)
    batch = (start, bars[0]) if bars else empty
    in_start = bars[0] + 1 if bars else start
    inp = (in_start, arrows[0]) if arrows else empty
    out = (arrows[0] + 2 if arrows else in_start, end)
    rows = {kind: _parse_row(src, seg, kind, multi, entry) for kind, seg in zip(KINDS, (batch, inp, out), strict=True)}
    return SlotSpec(**rows)


def _check_parens(src: _Source, start: int, end: int) -> None:
    """Parentheses only group the axes of one row: each `(` closes in the row it opens, so a
    stray `)` (or one closing across `|`, `->`, `;`, `=>`) is not silently ignored."""
    opened: list[int] = []
    for i in range(start, end):
        if src.text[i] == "(":
            opened.append(i)
        elif src.text[i] == ")":
            if not opened:
                raise src.error(i, "unmatched ')': parentheses group axes within one row")
            opened.pop()
    if opened:
        raise src.error(opened[-1], "unclosed '(': parentheses group axes within one row")


def _parse_row(src: _Source, seg: tuple[int, int], kind: str, multi: bool, entry) -> RowSpec:
    _check_parens(src, *seg)
    tokens = _tokens_multi(src, *seg) if multi else _tokens_single(src, *seg)
    row_var, axes = None, []
    for i, (tok, pos) in enumerate(tokens):
        if tok.startswith("."):
            if i != 0:
                raise src.error(pos, "a row variable must be the leftmost entry of its row")
            row_var = _row_var_name(src, tok, pos, kind)
        else:
            axes.append(entry(src, tok, pos))
    return RowSpec(row_var, tuple(axes), seg[0])


def _row_var_name(src: _Source, tok: str, pos: int, kind: str) -> str:
    if tok == "...":
        return kind
    if len(tok) > 4 and tok.startswith("..") and tok.endswith("..") and _IDENT.fullmatch(tok[2:-2]):
        return tok[2:-2]
    raise src.error(pos, f'malformed row variable "{tok}": expected "..." or "..name.."')


def _tokens_multi(src: _Source, start: int, end: int) -> list[tuple[str, int]]:
    tokens, i, text = [], start, src.text
    while i < end:
        if text[i].isspace() or text[i] in _SEPARATORS:
            i += 1
            continue
        j = i
        while j < end and not (text[j].isspace() or text[j] in _SEPARATORS):
            j += 1
        tokens.append((text[i:j], i))
        i = j
    return tokens


def _tokens_single(src: _Source, start: int, end: int) -> list[tuple[str, int]]:
    text = src.text
    visible = [i for i in range(start, end) if not (text[i].isspace() or text[i] in "()")]
    if visible and all(_is_digits(text[i]) for i in visible):
        return [("".join(text[i] for i in visible), visible[0])]
    tokens, i = [], start
    while i < end:
        ch = text[i]
        if ch.isspace() or ch in "()":
            i += 1
        elif ch == ".":
            if text.startswith("...", i) and not text.startswith("....", i):
                tokens.append(("...", i))
                i += 3
                continue
            close = text.find("..", i + 2, end)
            if not text.startswith("..", i) or close < 0:
                raise src.error(i, 'unfinished row variable: expected "..." or "..name.."')
            tokens.append((text[i:close + 2], i))
            i = close + 2
        elif _is_word_char(ch):
            tokens.append((ch, i))
            i += 1
        else:
            hint = ("; affine axes and labels need multi-character mode (separate axes with commas)"
                    if ch in "*+-=" else "")
            raise src.error(i, f"unexpected character {ch!r}{hint}")
    return tokens


def _bad_char(src: _Source, tok: str, pos: int, allowed: str) -> ShapeError:
    for k, ch in enumerate(tok):
        if not (_is_word_char(ch) or ch in allowed):
            return src.error(pos + k, f"unexpected character {ch!r} in axis entry {tok!r}")
    return src.error(pos, f"malformed axis entry {tok!r}")


def _einsum_axis(src: _Source, tok: str, pos: int) -> AxisSpec:
    if tok == "_":
        return Anonymous()
    if _is_digits(tok):
        return FixedIndex(_number(src, tok, pos))
    if any(c in tok for c in "*+-"):
        return _conv_axis(src, tok, pos)
    if _IDENT.fullmatch(tok):
        return Label(tok)
    raise _bad_char(src, tok, pos, "_")


def _conv_axis(src: _Source, tok: str, pos: int) -> AxisSpec:
    """`c1*i + c2*j + k`: positive coefficients, a constant offset (negative: padding), and
    optionally `:right` after a negative constant, the padding after the end."""
    right: int | None = None
    if ":" in tok:
        colon = tok.index(":")
        after = tok[colon + 1:]
        if not _is_digits(after):
            raise src.error(pos + colon + 1, f"affine axis {tok!r}: expected the padding after the end "
                                             f"(digits) after ':', got {after!r}")
        if not re.search(r"-[0-9]+$", tok[:colon]):
            raise src.error(pos + colon, f"affine axis {tok!r}: ':' must follow the padding before the "
                                         f"start, written as a negative constant (e.g. o+k-0:1)")
        right = _number(src, after, pos + colon + 1)
        tok = tok[:colon]
    pieces = re.split(r"([+-])", tok)
    terms: list[tuple[int, str]] = []
    offset, sign, at = 0, 1, pos
    for k, piece in enumerate(pieces):
        if k % 2 == 1:
            sign = 1 if piece == "+" else -1
            at += 1
            continue
        if not piece:
            raise src.error(at, f"empty term in affine axis {tok!r}")
        coeff_text, star, name = piece.rpartition("*") if "*" in piece else ("", "", piece)
        if _is_digits(name) and not star:
            offset += sign * _number(src, name, at)
        elif _IDENT.fullmatch(name) and (not star or _is_digits(coeff_text)):
            coeff = _number(src, coeff_text, at) if star else 1
            if sign < 0 or coeff == 0:
                raise src.error(at, f"affine axis {tok!r}: coefficients must be positive")
            if any(n == name for _, n in terms):
                raise src.error(at, f"affine axis {tok!r}: {name!r} appears twice")
            terms.append((coeff, name))
        else:
            raise _bad_char(src, piece, at, "_*") if not star else src.error(
                at, f"affine axis {tok!r}: expected coefficient*label, got {piece!r}")
        at += len(piece)
    if not terms:
        raise src.error(pos, f"affine axis {tok!r} has no pseudo-label")
    if len(terms) == 1 and terms[0][0] == 1 and offset == 0 and not right:
        return Label(terms[0][1])
    return ConvAxis(tuple(terms), offset, None if right is None or right == max(0, -offset) else right)


def _shape_axis(src: _Source, tok: str, pos: int) -> SizedAxis:
    label, eq, size = tok.rpartition("=")
    if eq and not _IDENT.fullmatch(label):
        raise _bad_char(src, label, pos, "_") if label else src.error(pos, f"empty label in {tok!r}")
    if size == "_":
        if eq:
            raise src.error(pos, f"a label needs a known size: {tok!r}")
        return SizedAxis(None)
    if not _is_digits(size):
        raise src.error(pos, f"expected a size (3), a labelled size (rgb=3) or _, got {tok!r}")
    value = _number(src, size, pos + len(label) + len(eq))
    if value < 1:
        raise src.error(pos + len(label) + len(eq), f"dimension must be positive, got {size}")
    return SizedAxis(value, label or None)
