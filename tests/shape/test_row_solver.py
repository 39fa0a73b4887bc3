"""Unit tests of the row solver: substitution, unification, inequalities, bounds, closing."""

import pytest

from einjit.shape import ShapeError
from einjit.shape.row import (
    Bounds,
    Broadcastable,
    Dim,
    DimEq,
    DimIneq,
    Env,
    Kind,
    Row,
    RowEq,
    RowId,
    RowIneq,
    RowVar,
    Solved,
    TotalElems,
    Var,
    apply_constraint,
    close_dims,
    close_rows,
    get_row_var,
    get_var,
    new_dim,
    s_dim_one_in_entry,
    s_row_one_in_entry,
    solve,
    solve_dim_ineq,
    solve_row_ineq,
    subst_dim,
    subst_row,
    unify_dim,
    unify_row,
    unsolved_vars,
)

RID = RowId(1, Kind.OUTPUT, "t")


def row(*dims, var: RowVar | None = None) -> Row:
    ds = tuple(Dim(d) if isinstance(d, int) else d for d in dims)
    return Row(ds, var if var is not None else Broadcastable(), RID)


def sizes(env: Env, r: Row) -> tuple:
    r = subst_row(env, r)
    return tuple(d.d if isinstance(d, Dim) else d for d in r.dims), r.bcast


# ------------------------------------------------------------------ substitution

def test_subst_dim_follows_chains_and_fills_inferred_labels():
    env = Env()
    a, b = get_var(), get_var()
    env.dims[a] = Solved(b)
    env.dims[b] = Solved(Dim(3, None, 77))
    assert subst_dim(env, a) == Dim(3)
    env.labels[77] = "rgb"
    assert subst_dim(env, a) == Dim(3, "rgb")
    assert subst_dim(env, Var(12345)) == Var(12345)


def test_subst_row_prepends_axes_of_solved_row_variables():
    env = Env()
    v, w = get_row_var(), get_row_var()
    x = get_var()
    env.rows[v] = Solved(row(x, 5, var=w))
    env.rows[w] = Solved(row(2))
    env.dims[x] = Solved(Dim(7))
    assert sizes(env, row(9, var=v)) == ((2, 7, 5, 9), Broadcastable())


def test_s_dim_one_in_entry_turns_bounds_into_inequalities():
    v, key, other = get_var(), get_var(), get_var()
    entry = Bounds(cur=frozenset({v, other}), subr=frozenset(), lub=Dim(4))
    out, new = s_dim_one_in_entry(v, Dim(4), key, entry)
    assert out == [DimIneq(Dim(4), key)]
    assert new == Bounds(frozenset({other}), frozenset(), Dim(4))
    out, new = s_dim_one_in_entry(v, Dim(2), key, Bounds(subr=frozenset({v})))
    assert out == [DimIneq(key, Dim(2))] and new == Bounds()
    assert s_dim_one_in_entry(v, Dim(2), key, Solved(Dim(3))) == ([], Solved(Dim(3)))


def test_s_row_one_in_entry_turns_bounds_into_row_inequalities():
    v, k = get_row_var(), get_row_var()
    key = row(var=k)
    out, new = s_row_one_in_entry(v, row(3), key, Bounds(cur=frozenset({v})))
    assert out == [RowIneq(row(3), key)] and new == Bounds()
    out, new = s_row_one_in_entry(v, row(3), key, Bounds(subr=frozenset({v})))
    assert out == [RowIneq(key, row(3))] and new == Bounds()


# ------------------------------------------------------------------ equations

def test_unify_dim_solves_variables_and_checks_sizes():
    env = Env()
    a, b = get_var(), get_var()
    assert unify_dim(env, a, b) == []
    assert unify_dim(env, b, Dim(5)) == []
    assert subst_dim(env, a) == Dim(5)
    with pytest.raises(ShapeError, match="dimension mismatch.*5 vs 6"):
        unify_dim(env, a, Dim(6))


def test_unify_dim_releases_bounds_as_inequalities():
    env = Env()
    a, b = get_var(), get_var()
    solve_dim_ineq(env, a, b)
    assert unify_dim(env, a, Dim(3)) == [DimIneq(Dim(3), b)]
    assert env.dims[b] == Bounds()


def test_unify_dim_labels_must_agree_and_propagate():
    env = Env()
    with pytest.raises(ShapeError, match="label mismatch.*rgb=3 vs xyz=3"):
        unify_dim(env, Dim(3, "rgb"), Dim(3, "xyz"))
    unlabeled = new_dim(3)
    unify_dim(env, Dim(3, "rgb"), unlabeled)
    assert subst_dim(env, unlabeled) == Dim(3, "rgb")
    v = get_var()
    unify_dim(env, v, Dim(3, "rgb"))
    assert subst_dim(env, v).label == "rgb"


def test_unify_row_prepends_to_the_shorter_row_variable():
    env = Env()
    v = get_row_var()
    out = unify_row(env, row(4, var=v), row(2, 3, 4))
    assert out == [DimEq(Dim(4), Dim(4))]
    assert env.rows[v] == Solved(row(2, 3))
    assert sizes(env, row(var=v)) == ((2, 3), Broadcastable())


def test_unify_row_between_row_variables():
    env = Env()
    v, w = get_row_var(), get_row_var()
    unify_row(env, row(var=v), row(1, 2, var=w))
    assert sizes(env, row(9, var=v)) == ((1, 2, 9), w)


def test_unify_row_errors():
    env = Env()
    with pytest.raises(ShapeError, match="number of axes mismatch"):
        unify_row(env, row(2, 3), row(3))
    v = get_row_var()
    with pytest.raises(ShapeError, match="number of axes mismatch"):
        unify_row(env, row(1, 2, var=v), row(2))
    with pytest.raises(ShapeError, match="infinite number of axes"):
        unify_row(env, row(1, var=v), row(var=v))


def test_apply_constraint_total_elems_with_one_unknown():
    env = Env()
    x = get_var()
    r = Row((Dim(3), x), Broadcastable(), RID, TotalElems(12))
    [eq] = apply_constraint(env, r)
    solve(env, [eq])
    assert subst_dim(env, x) == Dim(4)
    assert apply_constraint(env, r) == []


def test_apply_constraint_waits_for_open_rows_and_several_unknowns():
    env = Env()
    v = get_row_var()
    assert apply_constraint(env, Row((Dim(3),), v, RID, TotalElems(12))) is None
    assert apply_constraint(env, Row((get_var(), get_var()), Broadcastable(), RID, TotalElems(12))) is None
    x = get_var()
    assert apply_constraint(env, Row((x, x), Broadcastable(), RID, TotalElems(9))) == [DimEq(x, Dim(3))]


def test_apply_constraint_errors():
    env = Env()
    with pytest.raises(ShapeError, match="12 elements do not fit.*product 5.*do not divide 12"):
        apply_constraint(env, Row((Dim(5), get_var()), Broadcastable(), RID, TotalElems(12)))
    with pytest.raises(ShapeError, match="12 elements do not fit.*which has 6"):
        apply_constraint(env, Row((Dim(2), Dim(3)), Broadcastable(), RID, TotalElems(12)))


# ------------------------------------------------------------------ inequalities

def test_solve_dim_ineq_on_known_dimensions():
    env = Env()
    assert solve_dim_ineq(env, Dim(3), Dim(3)) == []
    assert solve_dim_ineq(env, Dim(3), Dim(1)) == []
    with pytest.raises(ShapeError, match="cannot broadcast"):
        solve_dim_ineq(env, Dim(1), Dim(3))
    with pytest.raises(ShapeError, match="dimension mismatch"):
        solve_dim_ineq(env, Dim(2), Dim(3))


def test_solve_dim_ineq_with_variables():
    env = Env()
    v = get_var()
    assert solve_dim_ineq(env, v, Dim(4)) == [DimEq(v, Dim(4))]
    assert solve_dim_ineq(env, v, Dim(1)) == []
    assert solve_dim_ineq(env, Dim(1), v) == [DimEq(v, Dim(1))]
    assert solve_dim_ineq(env, Dim(5), v) == []
    assert env.dims[v].lub == Dim(5)


def test_lub_maintenance_same_bound_kept_conflicting_bounds_force_one():
    env = Env()
    v = get_var()
    solve_dim_ineq(env, Dim(5), v)
    assert solve_dim_ineq(env, Dim(5), v) == []
    assert solve_dim_ineq(env, Dim(5, "five"), v) == []
    assert env.dims[v].lub == Dim(5, "five")
    assert solve_dim_ineq(env, Dim(6), v) == [DimEq(v, Dim(1))]


def test_bounds_are_direct_edges_and_the_lub_propagates_down_the_chain():
    env = Env()
    a, b, c = get_var(), get_var(), get_var()
    solve(env, [DimIneq(a, b), DimIneq(b, c)])
    assert env.dims[a].subr == {b} and env.dims[b].subr == {c}
    assert env.dims[c].cur == {b} and env.dims[b].cur == {a}
    solve(env, [DimIneq(Dim(7), a)])
    assert env.dims[a].lub == env.dims[b].lub == env.dims[c].lub == Dim(7)
    solve(env, [DimIneq(a, c)])          # implied already; kept as a direct edge too
    assert env.dims[a].subr == {b, c}


def test_cycle_of_bounds_makes_variables_equal():
    env = Env()
    a, b, c = get_var(), get_var(), get_var()
    solve(env, [DimIneq(a, b), DimIneq(b, c), DimIneq(c, a)])
    solve(env, [DimEq(a, Dim(4))])
    assert subst_dim(env, b) == subst_dim(env, c) == Dim(4)


def test_solving_a_bounded_variable_propagates_to_its_bounds():
    env = Env()
    a, b = get_var(), get_var()
    solve(env, [DimIneq(a, b), DimEq(b, Dim(6))])
    assert subst_dim(env, a) == Dim(6)


def test_solve_row_ineq_expands_cur_with_a_template():
    env = Env()
    v = get_row_var()
    out = solve_row_ineq(env, row(var=v), row(2, 3))
    assert len(out) == 2 and isinstance(out[0], RowEq) and isinstance(out[1], RowIneq)
    solve(env, out)
    (d2, d3), bcast = sizes(env, row(var=v))
    assert (d2, d3) == (2, 3) and isinstance(bcast, RowVar)


def test_solve_row_ineq_too_many_axes_for_a_closed_row():
    with pytest.raises(ShapeError, match="too many axes: 2 axes do not fit into 1"):
        solve_row_ineq(Env(), row(3), row(2, 3))


def test_solve_row_ineq_broadcasts_a_shorter_closed_subr():
    env = Env()
    assert solve_row_ineq(env, row(2, 3), row(1)) == [DimIneq(Dim(3), Dim(1))]


def test_solve_row_ineq_sets_the_lub_of_a_subr_row_variable():
    env = Env()
    v = get_row_var()
    solve(env, [RowIneq(row(4, 5), row(var=v)), RowIneq(row(7, 5), row(var=v))])
    lub = env.rows[v].lub
    assert len(lub.dims) == 2
    assert subst_dim(env, lub.dims[1]) != Dim(1)
    assert env.dims[lub.dims[1]].lub == Dim(5)
    assert subst_dim(env, lub.dims[0]) == Dim(1)     # 4 and 7 conflict: only 1 fits under both
    solve(env, [RowIneq(row(5), row(var=v))])
    assert len(env.rows[v].lub.dims) == 1
    solve(env, [RowIneq(row(), row(var=v))])         # no axes above: no axes
    assert sizes(env, row(var=v)) == ((), Broadcastable())


def test_solve_row_ineq_between_row_variables_records_bounds():
    env = Env()
    v, w = get_row_var(), get_row_var()
    solve(env, [RowIneq(row(3, var=v), row(3, var=w))])
    assert env.rows[v].subr == {w} and env.rows[w].cur == {v}
    solve(env, [RowIneq(row(var=w), row(var=v))])      # a cycle: equal
    assert subst_row(env, row(var=w)).bcast == subst_row(env, row(var=v)).bcast


def test_row_inequality_waits_until_a_row_variable_is_solved():
    env = Env()
    v, w = get_row_var(), get_row_var()
    solve(env, [RowIneq(row(4, var=v), row(var=w))])
    assert len(env.pending) == 1
    solve(env, [RowEq(row(var=v), row(2))])
    assert env.pending == []
    assert len(env.rows[w].lub.dims) == 2


def test_cyclic_row_constraints_are_reported():
    env = Env()
    v, w = get_row_var(), get_row_var()
    with pytest.raises(ShapeError, match="infinite number of axes"):
        solve(env, [RowIneq(row(var=v), row(1, var=w)), RowIneq(row(var=w), row(1, var=v))])


# ------------------------------------------------------------------ closing

def test_closing_rows_takes_the_lub_else_no_further_axes():
    env = Env()
    v, w = get_row_var(), get_row_var()
    solve(env, [RowIneq(row(2, 3), row(var=v))])
    rows, _ = unsolved_vars(env, [row(var=v), row(var=w)])
    assert rows == [v, w]
    solve(env, close_rows(env, rows, [], set(), set()))
    rows, dims = unsolved_vars(env, [row(var=v), row(var=w)])
    assert rows == [w]
    solve(env, close_dims(env, dims, [], set()))
    assert sizes(env, row(var=v)) == ((2, 3), Broadcastable())
    solve(env, close_rows(env, rows, [], set(), set()))
    assert sizes(env, row(var=w)) == ((), Broadcastable())


def test_closing_rows_prefers_variables_not_waiting_on_an_inequality():
    env = Env()
    v, w = get_row_var(), get_row_var()
    solve(env, [RowIneq(row(4, var=v), row(var=w))])
    [closing] = close_rows(env, [v, w], [], set(), set())
    assert closing.r1.bcast == v


def test_closing_dims_takes_the_lub_else_one():
    env = Env()
    a, b = get_var(), get_var()
    solve(env, [DimIneq(Dim(8), a), DimIneq(b, a)])
    solve(env, close_dims(env, [a, b], [], set()))
    assert subst_dim(env, a) == Dim(8) and subst_dim(env, b) == Dim(8)
    c = get_var()
    assert close_dims(env, [c], [], set()) == [DimEq(c, Dim(1))]
    d = get_var()
    assert close_dims(env, [c, d], [], {c}) == [DimEq(d, Dim(1))]
