"""The KV cache's masks and bounds."""

import numpy as np
import pytest

from pyggml.backend import init_by_name
from pyggml.errors import AllocationError
from pyggml.models.kv_cache import KVCache, causal_mask


def test_causal_mask_lets_each_query_see_itself_and_earlier_cells():
    m = causal_mask(pos0=2, n_tokens=3)
    assert m.shape == (3, 5) and m.dtype == np.float32
    assert (m == 0).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert np.all(np.isneginf(m[m != 0]))


def test_sliding_window_hides_cells_window_or_more_positions_back():
    m = causal_mask(pos0=4, n_tokens=2, window=3)
    assert (m == 0).tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]


def test_cache_is_zeroed_sized_and_refuses_positions_past_its_cells():
    kv = KVCache(init_by_name("CPU"), n_layer=2, n_head_kv=2, n_embd_k=8, n_embd_v=8, size=16)
    assert kv.nbytes >= 2 * 2 * 8 * 16 * 2
    assert not kv.k[0].numpy().any()
    with pytest.raises(AllocationError, match="KV cache full"):
        kv.check_room(10, 7)
