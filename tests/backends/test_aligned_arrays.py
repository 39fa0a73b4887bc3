"""Host arrays einjit allocates start on a cache line (`memory.ALIGN`): generated kernels
read and store rows of them in whole vectors, and a row that straddles two lines costs twice
the cache traffic."""

from __future__ import annotations

import numpy as np
import pytest

from einjit import memory
from einjit.backends.cc.backend import CcBackend
from einjit.ir.tnode import Tnode, hosted


@pytest.mark.parametrize("dims,dtype", [((512, 512), np.float32), ((3, 5), np.float64), ((0, 4), np.float32),
                                        ((7,), np.int32)])
def test_zeros_are_aligned_zeros_of_the_shape(dims, dtype):
    for arr in (memory.zeros("x", dims, dtype), memory.aligned_zeros(dims, dtype)):
        assert arr.size == 0 or arr.ctypes.data % memory.ALIGN == 0  # an empty array has no data to place
        assert arr.shape == dims and arr.dtype == dtype and arr.flags.c_contiguous and arr.flags.writeable
        assert not arr.any()
        arr[...] = 1
        assert arr.sum() == arr.size


def test_context_arrays_are_aligned_copies_of_host_arrays():
    host = np.arange(512 * 3, dtype=np.float32).reshape(512, 3)
    kept, fresh = Tnode("kept", (512, 3)), Tnode("fresh", (9, 9))
    kept.update_memory_mode(hosted(), 0)
    kept.host_array()[...] = host
    ctx = CcBackend().init("aligned")
    for tn in (kept, fresh):
        assert ctx.array(tn).ctypes.data % memory.ALIGN == 0
    np.testing.assert_array_equal(ctx.array(kept), host)
    assert ctx.array(kept) is not kept.host_array()
    assert not ctx.array(fresh).any()
