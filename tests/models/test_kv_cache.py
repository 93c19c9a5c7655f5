"""The KV cache's masks and bounds."""

import numpy as np

from pyggml.backend import init_by_name
from pyggml.models.llm.kv_cache import KVCache, causal_mask
from pyggml.models.llm.kv_cells import KVCells


def test_causal_mask_lets_each_query_see_itself_and_earlier_cells():
    m = causal_mask(pos0=2, n_tokens=3)
    assert m.shape == (3, 5) and m.dtype == np.float32
    assert (m == 0).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert np.all(np.isneginf(m[m != 0]))


def test_sliding_window_hides_cells_window_or_more_positions_back():
    m = causal_mask(pos0=4, n_tokens=2, window=3)
    assert (m == 0).tolist() == [[0, 0, 1, 1, 1, 0], [0, 0, 0, 1, 1, 1]]


def test_cache_is_zeroed_and_sized():
    kv = KVCache(init_by_name("CPU"), n_layer=2, n_head_kv=2, n_embd_k=8, n_embd_v=8, size=16)
    assert kv.nbytes >= 2 * 2 * 8 * 16 * 2
    assert not kv.k[0].numpy().any()


def test_one_sequence_in_the_unified_cells_has_the_causal_mask():
    cells = KVCells(16, 2)
    cells.apply(np.arange(7), range(7), [(1,)] * 7)
    for window in (None, 3):
        got = cells.mask(np.arange(4, 7), np.ones(3, dtype=int), 16, window)
        np.testing.assert_array_equal(got, causal_mask(4, 3, window, 16))
