"""Fuzzing the two notations: `%cd` texts and einsum specs, generated from their grammars and
then mutated character by character. The property: every outcome is a value or an
`EinjitError` — never another exception, never a crash or a hang.

200 examples per property by default (derandomized, so CI sees the same ones every run);
`pytest -m slow` runs 2,000 fresh random ones per property.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import einjit as ej
from einjit import shape as sh
from einjit import train
from einjit.backends.interface import lower_assignments
from einjit.shape.einsum import parse_einsum, parse_shape_spec
from einjit.tensor import cd_syntax
from einjit.tensor.notation import as_asgns

DEFAULT = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
SLOW = settings(max_examples=2000, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

# ---------------------------------------------------------------- mutation

ODD_CHARS = list("()[]{};:,.=+-*/%<>!?^&|~'\"\\@#$_ \t\n0123456789aeijkxyz") + [
    "\u0663", "\u00b2", "\u00e9", "\u2212", "\u00a0", "\x00", "\U0001d7d9", "\u216b", "..", "...", "=>", "->", "=:",
    "~~", "**", "-?/", "^^", "vv", "9" * 40, "9" * 5000, "(" * 80, ")" * 80, "1e999", "0x1F"]


@st.composite
def mutated(draw, base: st.SearchStrategy[str]) -> str:
    """A text from `base`, then (half of the time) up to 4 edits: delete a span, insert an odd
    piece, duplicate a span, swap two halves, wrap a span in many parentheses or repeat it
    many times (deep nesting and long chains)."""
    text = draw(base)
    for _ in range(draw(st.sampled_from([0, 0, 0, 0, 1, 1, 2, 4]))):
        n = len(text)
        i = draw(st.integers(0, n))
        j = draw(st.integers(i, min(n, i + 8)))
        match draw(st.sampled_from(["delete", "insert", "duplicate", "swap", "wrap", "repeat"])):
            case "delete":
                text = text[:i] + text[j:]
            case "insert":
                text = text[:i] + draw(st.sampled_from(ODD_CHARS)) + text[i:]
            case "duplicate":
                text = text[:j] + text[i:j] + text[j:]
            case "swap":
                text = text[i:] + text[:i]
            case "wrap":
                k = draw(st.sampled_from([1, 70, 300]))
                text = text[:i] + "(" * k + text[i:j] + ")" * k + text[j:]
            case "repeat":
                text = text[:i] + text[i:j] * draw(st.sampled_from([2, 100, 1000])) + text[j:]
    return text


# ---------------------------------------------------------------- einsum specs

LABELS = st.sampled_from(list("abijk_") + ["0", "1"])
MULTI_LABELS = st.sampled_from(["i", "j", "k", "i", "j", "height", "_", "0", "1", "2*i+k", "i+j", "3*o+2*k+1",
                                "i-1", "0*i"])


@st.composite
def einsum_row(draw, multi: bool) -> str:
    prefix = draw(st.sampled_from(["", "...", "...", "..v.."]))
    entries = draw(st.lists(MULTI_LABELS if multi else LABELS, max_size=3))
    if multi:
        return ", ".join(([prefix] if prefix else []) + entries)
    return prefix + "".join(entries)


@st.composite
def einsum_slot(draw, multi: bool) -> str:
    out = draw(einsum_row(multi))
    if draw(st.booleans()):
        out = draw(einsum_row(multi)) + "->" + out
    if draw(st.booleans()):
        out = draw(einsum_row(multi)) + "|" + out
    return out


@st.composite
def einsum_spec(draw) -> str:
    multi = draw(st.booleans())
    rhs = [draw(einsum_slot(multi)) for _ in range(draw(st.integers(1, 2)))]
    spec = ";".join(rhs) + "=>" + draw(einsum_slot(multi))
    return spec + ("," if multi and "," not in spec else "")


@st.composite
def fitting_spec(draw) -> str:
    """A spec whose argument slots fit the operands' axes (`operands`), so that shape
    inference and lowering run too: one axis per row or a row variable."""
    multi = draw(st.booleans())
    sep = ", " if multi else ""

    def axis(pool: str) -> str:
        return draw(st.sampled_from(["...", *pool]))

    a = f"{axis('bij')}|{axis('ijk')}->{axis('ijk')}"
    b = axis("ijk")
    rhs = [a, b][:draw(st.integers(1, 2))]
    used = sorted({c for slot in rhs for c in slot if c.isalpha()})
    rows = [sep.join(draw(st.lists(st.sampled_from(used + ["0", "..."]) if used else st.just("0"), max_size=2)))
            for _ in range(3)]
    lhs = f"{rows[0]}|{rows[1]}->{rows[2]}" if draw(st.booleans()) else rows[2]
    return ";".join(rhs) + "=>" + lhs + ("," if multi else "")


SPECS = mutated(st.one_of(fitting_spec(), einsum_spec()))


def operands() -> list[ej.Tensor]:
    """Two small tensors: a batch axis, an input and an output axis; an output axis only."""
    a = ej.ndarray(np.arange(12.0).reshape(2, 2, 3), batch_axes=1, input_axes=1, label="fa")
    b = ej.ndarray(np.arange(3.0) + 1, label="fb")
    return [a, b]


def einsum_outcome(spec: str) -> None:
    """Parse, then build and (when shapes close) lower: a value or an EinjitError."""
    sh.reset_state()
    try:
        parsed = parse_einsum(spec)
        a, b = operands()
        args = [a, b][:len(parsed.rhs)]
        t = ej.einsum(spec, *args)
        lower_assignments((), train.forward(t), "fuzz_einsum")
    except ej.EinjitError:
        pass
    finally:
        sh.reset_state()


@DEFAULT
@given(SPECS)
def test_einsum_specs_give_a_value_or_an_einjit_error(spec):
    einsum_outcome(spec)


@DEFAULT
@given(mutated(st.sampled_from(["2|3->rgb=3,4", "...|_->10", "..b..|2,3->4", "3", "a=2, b=_", "_"])))
def test_shape_specs_give_a_value_or_an_einjit_error(text):
    try:
        parse_shape_spec(text)
    except ej.EinjitError:
        pass


# ---------------------------------------------------------------- %cd texts

NAMES = ["a", "b", "c", "p", "p.grad", "a.value", "b.merge", "unknown"]
FUNCTIONS = sorted(cd_syntax.FUNCTIONS)
INFIX = ["+", "-", "*", "/", "%", "**", "<", "==", "<>", "&&", "||", "-?/", "-?^"]
NUMBERS = st.sampled_from(["1", "2.5", ".5", "3.", "1e3", "2E-2", "0", "'q' 2.0", "1e999", "9" * 400])


def cd_expr() -> st.SearchStrategy[str]:
    leaf = st.one_of(st.sampled_from(NAMES), NUMBERS)

    def extend(inner):
        return st.one_of(
            st.tuples(inner, st.sampled_from(INFIX), inner).map(" ".join),
            inner.map(lambda e: f"-{e}"),
            inner.map(lambda e: f"({e})"),
            st.tuples(st.sampled_from(FUNCTIONS), st.lists(inner, min_size=1, max_size=3)).map(
                lambda fa: f"{fa[0]}({', '.join(fa[1])})"))

    return st.recursive(leaf, extend, max_leaves=8)


@st.composite
def cd_stmt(draw) -> str:
    lhs = draw(st.sampled_from(['"t"', '"u"', "c", "p", "p.grad", "a", "c.merge"]))
    op = draw(st.sampled_from(["=:", "=+", "=:+", "=-", "=*", "=:^^", "=vv", "=:/", "=:**", "=?/", "=", "=:&&"]))
    text = f"{lhs} {op} {draw(cd_expr())}"
    match draw(st.integers(0, 3)):
        case 1:
            text += f' ~logic:"{draw(st.sampled_from([".", "@", "T"]) | einsum_spec())}"'
        case 2:
            text += " ~projections:pr"
    return text


@st.composite
def cd_text(draw) -> str:
    stmts = draw(st.lists(cd_stmt(), min_size=1, max_size=3))
    text = "; ".join(stmts)
    if draw(st.booleans()):
        text = f'~~("block"; {text})'
    return text


def cd_env() -> dict[str, object]:
    a = ej.ndarray(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), label="ca")
    b = ej.ndarray(np.array([1.0, -1.0, 0.5]), label="cb")
    c = ej.ndarray(np.zeros((2, 3)), label="cc")
    p = ej.param("fuzz_p", values=[0.5, 1.5, -2.0])
    return dict(a=a, b=b, c=c, p=p, pr=3, unknown_thing=None)


def cd_outcome(text: str) -> None:
    sh.reset_state()
    try:
        code = ej.cd(text, **cd_env())
        lower_assignments((), as_asgns(code), "fuzz_cd")
    except ej.EinjitError:
        pass
    finally:
        sh.reset_state()


CD_TEXTS = mutated(cd_text())


@DEFAULT
@given(CD_TEXTS)
def test_cd_texts_give_a_value_or_an_einjit_error(text):
    cd_outcome(text)


@DEFAULT
@given(st.text(max_size=60))
def test_arbitrary_text_gives_a_value_or_an_einjit_error(text):
    cd_outcome(text)
    einsum_outcome(text)


@pytest.mark.slow
@SLOW
@given(SPECS)
def test_einsum_specs_slow(spec):
    einsum_outcome(spec)


@pytest.mark.slow
@SLOW
@given(CD_TEXTS)
def test_cd_texts_slow(text):
    cd_outcome(text)


@pytest.mark.slow
@SLOW
@given(st.text(max_size=120))
def test_arbitrary_text_slow(text):
    cd_outcome(text)
    einsum_outcome(text)


# ---------------------------------------------------------------- literals

ELEMENTS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70), st.booleans(),
                     st.none(), st.text(max_size=2), st.complex_numbers(max_magnitude=10),
                     st.sampled_from([np.float32(1.5), np.int8(-3), np.bool_(True), np.datetime64("2020-01-01")]))
LITERALS = st.recursive(ELEMENTS, lambda inner: st.lists(inner, min_size=0, max_size=3), max_leaves=12)


def literal_outcome(values) -> None:
    """A literal of output axes (lists only): a tensor holding exactly NumPy's float64
    conversion, or a TensorError/ShapeError."""
    try:
        t = ej.ndarray(values, prec="double")
    except ej.EinjitError:
        return
    want = np.array(values, dtype=np.float64)
    got = t.value_tn.array
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.reshape(want.shape), want)


@DEFAULT
@given(LITERALS)
def test_literals_give_their_values_or_an_einjit_error(values):
    literal_outcome(values)


@pytest.mark.slow
@SLOW
@given(LITERALS)
def test_literals_slow(values):
    literal_outcome(values)
