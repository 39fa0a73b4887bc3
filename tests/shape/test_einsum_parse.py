"""The einsum and shape notation parser: modes, row variables, fixed and affine axes, errors."""

import pytest

from einjit.shape import ShapeError, parse_einsum, parse_shape_spec
from einjit.shape.einsum import Anonymous, ConvAxis, FixedIndex, Label, RowSpec, SizedAxis


def labels(row: RowSpec) -> list:
    return [a.name if isinstance(a, Label) else a for a in row.axes]


def test_binary_spec_single_char_mode():
    spec = parse_einsum("ij;jk=>ik")
    assert len(spec.rhs) == 2
    assert labels(spec.rhs[0].output) == ["i", "j"]
    assert labels(spec.rhs[1].output) == ["j", "k"]
    assert labels(spec.lhs.output) == ["i", "k"]
    for slot in (*spec.rhs, spec.lhs):
        assert slot.batch == RowSpec(None, ()) and slot.input == RowSpec(None, ())


def test_slot_forms_batch_input_output():
    slot = parse_einsum("b|i->o=>o").rhs[0]
    assert labels(slot.batch) == ["b"] and labels(slot.input) == ["i"] and labels(slot.output) == ["o"]
    slot = parse_einsum("i->o=>o").rhs[0]
    assert slot.batch.axes == () and labels(slot.input) == ["i"] and labels(slot.output) == ["o"]
    slot = parse_einsum("b|o=>o").rhs[0]
    assert labels(slot.batch) == ["b"] and slot.input.axes == () and labels(slot.output) == ["o"]


def test_whitespace_and_parentheses_are_ignored_in_single_char_mode():
    spec = parse_einsum("a b (c) => c b a")
    assert labels(spec.rhs[0].output) == ["a", "b", "c"]
    assert labels(spec.lhs.output) == ["c", "b", "a"]


def test_comma_switches_to_multi_char_mode():
    spec = parse_einsum("batch | height, width -> channels => height")
    slot = spec.rhs[0]
    assert labels(slot.batch) == ["batch"]
    assert labels(slot.input) == ["height", "width"]
    assert labels(slot.output) == ["channels"]
    assert labels(parse_einsum("abc, => abc").rhs[0].output) == ["abc"]
    assert labels(parse_einsum("abc => abc").rhs[0].output) == ["a", "b", "c"]


def test_digits_are_fixed_indices():
    assert parse_einsum("b00c=>b").rhs[0].output.axes == (Label("b"), FixedIndex(0), FixedIndex(0), Label("c"))
    assert parse_einsum("12=>_").rhs[0].output.axes == (FixedIndex(12),)
    assert parse_einsum("i, 12 => i").rhs[0].output.axes == (Label("i"), FixedIndex(12))
    assert parse_einsum("...|... => 0").lhs.output.axes == (FixedIndex(0),)


def test_row_variables_are_context_dependent_or_named():
    spec = parse_einsum("...|...->...; ..v..|x => ..v..|...")
    r1, r2 = spec.rhs
    assert (r1.batch.row_var, r1.input.row_var, r1.output.row_var) == ("batch", "input", "output")
    assert r2.batch.row_var == "v" and r2.input.row_var is None
    assert spec.lhs.batch.row_var == "v" and spec.lhs.output.row_var == "output"
    assert parse_einsum("..rest.., a, b => b").rhs[0].output == RowSpec("rest", (Label("a"), Label("b")))


def test_anonymous_axis():
    assert parse_einsum("_i=>i").rhs[0].output.axes == (Anonymous(), Label("i"))


def test_affine_convolution_axes():
    slot = parse_einsum("2*o+3*k, c; k, c => o").rhs[0]
    assert slot.output.axes == (ConvAxis(((2, "o"), (3, "k")), 0), Label("c"))
    assert parse_einsum("o+k+1, => o").rhs[0].output.axes == (ConvAxis(((1, "o"), (1, "k")), 1),)
    assert parse_einsum("1*o, => o").rhs[0].output.axes == (Label("o"),)


def test_negative_offset_is_padding():
    assert parse_einsum("2*o+k-1, ; k, => o,").rhs[0].output.axes == (ConvAxis(((2, "o"), (1, "k")), -1),)
    assert parse_einsum("o-2, => o,").rhs[0].output.axes == (ConvAxis(((1, "o"),), -2),)


def test_padding_after_the_end_is_written_after_a_colon():
    axis = parse_einsum("2*o+k-1:2, ; k, => o,").rhs[0].output.axes[0]
    assert axis == ConvAxis(((2, "o"), (1, "k")), -1, 2) and axis.padding == (1, 2)
    assert parse_einsum("o+k-0:1, ; k, => o,").rhs[0].output.axes[0].padding == (0, 1)
    assert parse_einsum("o+k-1:1, ; k, => o,").rhs[0].output.axes[0] == ConvAxis(((1, "o"), (1, "k")), -1)
    assert parse_einsum("o-0:0, => o,").rhs[0].output.axes == (Label("o"),)


@pytest.mark.parametrize("spec, column, message", [
    ("o+k-1:x, ; k, => o,", 7, "expected the padding after the end"),
    ("o+k:1, ; k, => o,", 4, "':' must follow the padding before the start"),
    ("o+k+1:1, ; k, => o,", 6, "':' must follow the padding before the start"),
])
def test_malformed_right_padding_names_the_column(spec, column, message):
    with pytest.raises(ShapeError, match=rf"column {column}\b.*{message}"):
        parse_einsum(spec)


def test_shape_spec_sizes_labels_and_unknowns():
    slot = parse_shape_spec("2|3->rgb=3,4")
    assert slot.batch.axes == (SizedAxis(2),)
    assert slot.input.axes == (SizedAxis(3),)
    assert slot.output.axes == (SizedAxis(3, "rgb"), SizedAxis(4))
    slot = parse_shape_spec("...|_->10")
    assert slot.batch == RowSpec("batch", ()) and slot.input.axes == (SizedAxis(None),)
    assert parse_shape_spec("23").output.axes == (SizedAxis(23),)


@pytest.mark.parametrize("spec, column, fragment", [
    ("ab;bc=>a*c", 9, "unexpected character '*'"),
    ("ab;bc", 6, 'missing "=>"'),
    ("a=>b=>c", 5, 'more than one "=>"'),
    ("a;b;c=>d", 4, "at most two argument slots"),
    ("a=>b;c", 5, '";" separates argument slots'),
    ("a|b|c=>a", 4, 'more than one "|"'),
    ("a->b|c=>a", 5, '"|" (after the batch axes) must come before "->"'),
    ("a->b->c=>a", 5, 'more than one "->"'),
    ("a...=>a", 2, "row variable must be the leftmost"),
    ("..v=>a", 1, "unfinished row variable"),
    ("..v-.., i => i", 1, "malformed row variable"),
    ("i, -o => o", 4, "empty term"),
    ("i, 2*o-k => o", 8, "coefficients must be positive"),
    ("i, 0*o => o", 4, "coefficients must be positive"),
    ("i, o*2 => o", 4, "expected coefficient*label"),
    ("i, o+o => o", 6, "'o' appears twice"),
    ("i, a$b => i", 5, "unexpected character '$'"),
    ("i, 3 => 2x,", 9, "malformed axis entry '2x'"),
    ("ij)=>ji", 3, "unmatched ')'"),
    (")=>", 1, "unmatched ')'"),
    ("ij=>j)i", 6, "unmatched ')'"),
    ("i(j=>ij", 2, "unclosed '('"),
    ("a, b) => b, a", 5, "unmatched ')'"),
    ("(a|b)=>a", 1, "unclosed '('"),
    ("(i;j)=>ij", 1, "unclosed '('"),
    ("i!j=>ij", 2, "unexpected character '!'"),
    ("i@j=>ij", 2, "unexpected character '@'"),
    ("i[j]=>ij", 2, "unexpected character '['"),
    ("i, a#b => i", 5, "unexpected character '#'"),
])
def test_parse_errors_name_spec_and_column(spec, column, fragment):
    with pytest.raises(ShapeError) as err:
        parse_einsum(spec)
    msg = str(err.value)
    assert msg.startswith(f'einsum spec "{spec}": column {column}: '), msg
    assert fragment in msg


@pytest.mark.parametrize("spec, column, fragment", [
    ("2|x->3", 3, "expected a size (3), a labelled size (rgb=3) or _, got 'x'"),
    ("0", 1, "dimension must be positive"),
    ("rgb=_", 1, "a label needs a known size"),
    ("a=>b", 2, "describes one shape"),
    ("=3", 1, "empty label"),
    ("(3->4", 1, "unclosed '('"),
    ("3)", 2, "unmatched ')'"),
])
def test_shape_spec_errors(spec, column, fragment):
    with pytest.raises(ShapeError) as err:
        parse_shape_spec(spec)
    msg = str(err.value)
    assert msg.startswith(f'shape spec "{spec}": column {column}: '), msg
    assert fragment in msg
