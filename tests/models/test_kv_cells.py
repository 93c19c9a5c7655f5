"""The unified cache's bookkeeping: random operation sequences against a plain model of the cells and against
llama.cpp's sequence positions after the same operations (committed, and live where llama-cpp-python is)."""

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyggml.errors import ParameterError
from pyggml.models.llm.kv_cells import KVCells

from tests.models.data.make_llamacpp_seq_ops import N_CTX, N_SEQ, apply_op, positions, random_ops

DATA = Path(__file__).with_name("data") / "llamacpp_seq_ops.json"
SIZE, N = 24, 3


class PlainCells:
    """Cells as a dict {cell: [position, set of sequences]}, each operation written out from its definition."""

    def __init__(self):
        self.cells = {}

    def in_range(self, pos, p0, p1):
        return (p0 < 0 or pos >= p0) and (p1 < 0 or pos < p1)

    def decode(self, seq_ids, n):
        p0 = max(self.pos_max(s) for s in seq_ids) + 1
        free = [c for c in range(SIZE) if c not in self.cells][:n]
        for i, c in enumerate(free):
            self.cells[c] = [p0 + i, set(seq_ids)]

    def pos_max(self, s):
        return max((p for p, seqs in self.cells.values() if s in seqs), default=-1)

    def rm(self, s, p0, p1):
        for c, (pos, seqs) in list(self.cells.items()):
            if self.in_range(pos, p0, p1) and (s < 0 or s in seqs):
                seqs.discard(s)
                if s < 0 or not seqs:
                    del self.cells[c]

    def cp(self, src, dst, p0, p1):
        for pos, seqs in self.cells.values():
            if src in seqs and self.in_range(pos, p0, p1):
                seqs.add(dst)

    def keep(self, s):
        for c, (_, seqs) in list(self.cells.items()):
            if s in seqs:
                self.cells[c][1] = {s}
            else:
                del self.cells[c]

    def add(self, s, p0, p1, delta):
        for c, cell in list(self.cells.items()):
            if s in cell[1] and self.in_range(cell[0], p0, p1):
                cell[0] += delta
                if cell[0] < 0:
                    del self.cells[c]

    def div(self, s, p0, p1, d):
        for cell in self.cells.values():
            if s in cell[1] and self.in_range(cell[0], p0, p1):
                cell[0] //= d


seqs = st.integers(0, N - 1)
bounds = st.integers(-1, 30)
operations = st.lists(st.one_of(
    st.tuples(st.just("decode"), st.sets(seqs, min_size=1, max_size=2), st.integers(1, 6)),
    st.tuples(st.just("rm"), st.integers(-1, N - 1), bounds, bounds),
    st.tuples(st.just("cp"), seqs, seqs, bounds, bounds),
    st.tuples(st.just("keep"), seqs),
    st.tuples(st.just("add"), seqs, bounds, bounds, st.integers(-8, 8)),
    st.tuples(st.just("div"), seqs, bounds, bounds, st.integers(1, 4))), max_size=40)


@given(operations)
def test_random_operations_match_a_plain_model_of_the_cells(ops):
    cells, plain = KVCells(SIZE, N), PlainCells()
    for op in ops:
        kind, args = op[0], op[1:]
        if kind == "decode":
            seq_ids, n = args
            if len({cells.seq_pos_max(s) for s in seq_ids}) > 1 or SIZE - cells.used < n:
                continue  # llama.cpp refuses such a batch: a token's sequences must continue at one position
            p0 = cells.seq_pos_max(next(iter(seq_ids))) + 1
            cells.apply(cells.find_slot(n), range(p0, p0 + n), [tuple(seq_ids)] * n)
            plain.decode(seq_ids, n)
        else:
            getattr(cells, f"seq_{kind}")(*args)
            getattr(plain, kind)(*args)
        state = {int(c): [int(cells.pos[c]), set(np.flatnonzero(cells.seq[c]).tolist())]
                 for c in np.flatnonzero(cells.pos >= 0)}
        assert state == plain.cells
        assert cells.used == len(plain.cells)
        assert all(cells.seq_pos_max(s) == plain.pos_max(s) for s in range(N))


def _replay(ops):
    cells, after = KVCells(N_CTX, N_SEQ), []
    for op in ops:
        apply_op(cells, op)
        after.append(positions(cells))
    return after


def test_sequence_positions_match_llamacpps_after_the_same_operations():
    refs = json.loads(DATA.read_text())
    assert refs["n_seq"] == N_SEQ and len(refs["cases"]) >= 10
    for case in refs["cases"]:
        assert _replay(case["ops"]) == case["positions"]


@pytest.mark.peer
def test_sequence_positions_match_live_llamacpp():
    pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed")
    from pyggml.testing.llamacpp_batched import LlamaCppSequences
    from pyggml.testing.synthetic import write_llama

    rng = np.random.default_rng(11)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama.gguf"
        write_llama(path, n_ctx=N_CTX)
        llm = LlamaCppSequences(path, n_ctx=N_CTX, n_batch=16, n_seq_max=N_SEQ)
        try:
            for _ in range(4):
                llm.clear()
                ops = random_ops(rng, 30)
                expected = []
                for op in ops:
                    apply_op(llm, op)
                    expected.append(positions(llm))
                assert _replay(ops) == expected
        finally:
            llm.close()


def test_masks_follow_each_tokens_first_sequence_and_window():
    cells = KVCells(8, 2)
    cells.apply(np.arange(4), [0, 1, 2, 3], [(0,), (0,), (0, 1), (1,)])
    mask = cells.mask(np.array([2, 3]), np.array([0, 1]), 8)
    assert (mask == 0).tolist() == [[1, 1, 1, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0, 0, 0]]
    assert (cells.mask(np.array([3]), np.array([1]), 8, window=1) == 0).tolist() == [[0, 0, 0, 1, 0, 0, 0, 0]]
    assert cells.n_kv() == 8 and cells.used == 4


def test_bad_sequence_ids_and_divisors_are_refused():
    cells = KVCells(8, 2)
    with pytest.raises(ParameterError, match="sequence id 2"):
        cells.seq_rm(2)
    with pytest.raises(ParameterError, match="sequence id -1"):
        cells.seq_cp(-1, 0)
    with pytest.raises(ParameterError, match="divisor"):
        cells.seq_div(0, 0, -1, 0)
