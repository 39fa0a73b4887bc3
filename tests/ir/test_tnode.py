"""Memory modes: narrowing updates, and conflicts reported with both provenances."""

from __future__ import annotations

import pytest

from einjit.ir import ops
from einjit.ir.tnode import (
    DEVICE_ONLY,
    EFFECTIVELY_CONSTANT,
    LOCAL,
    MATERIALIZED,
    NEVER_VIRTUAL,
    ON_DEVICE,
    VIRTUAL,
    MemoryModeError,
    MemoryType,
    Tnode,
    hosted,
)


def node():
    return Tnode("x", (2, 3), ops.single)


@pytest.mark.parametrize("first,second,result", [
    (NEVER_VIRTUAL, LOCAL, LOCAL),
    (NEVER_VIRTUAL, hosted(MemoryType.CONSTANT), hosted(MemoryType.CONSTANT)),
    (DEVICE_ONLY, ON_DEVICE, ON_DEVICE),
    (MATERIALIZED, DEVICE_ONLY, ON_DEVICE),
    (MATERIALIZED, hosted(), hosted()),
    (hosted(), hosted(MemoryType.VOLATILE), hosted(MemoryType.VOLATILE)),
    (EFFECTIVELY_CONSTANT, VIRTUAL, VIRTUAL),
    (EFFECTIVELY_CONSTANT, MATERIALIZED, hosted(MemoryType.CONSTANT)),
    (LOCAL, NEVER_VIRTUAL, LOCAL),
    (ON_DEVICE, ON_DEVICE, ON_DEVICE),
])
def test_updates_narrow_the_mode(first, second, result):
    tn = node()
    tn.update_memory_mode(first, 1)
    tn.update_memory_mode(second, 2)
    assert tn.memory_mode == result


@pytest.mark.parametrize("first,second", [
    (VIRTUAL, NEVER_VIRTUAL), (LOCAL, ON_DEVICE), (hosted(MemoryType.CONSTANT), hosted(MemoryType.VOLATILE)),
    (DEVICE_ONLY, hosted()), (EFFECTIVELY_CONSTANT, LOCAL),
])
def test_inconsistent_update_names_both_modes_and_provenances(first, second):
    tn = node()
    tn.update_memory_mode(first, 11)
    with pytest.raises(MemoryModeError) as e:
        tn.update_memory_mode(second, 22)
    msg = str(e.value)
    assert "x#" in msg and str(first) in msg and str(second) in msg
    assert "provenance 11" in msg and "provenance 22" in msg
    assert tn.memory_mode == first
    tn.update_memory_mode(first, 33)
    assert tn.memory_mode == first


def test_hosted_needs_a_memory_type():
    with pytest.raises(ValueError):
        hosted(None)


def test_predicates():
    tn = node()
    assert not tn.is_virtual() and not tn.is_hosted()
    tn.update_memory_mode(hosted(MemoryType.CONSTANT), 0)
    assert tn.is_hosted() and tn.is_constant() and tn.is_materialized_known()
    assert tn.host_array().shape == (2, 3) and tn.host_array().dtype == ops.single.dtype
