"""Which KV cache cell holds what: llama.cpp's unified cache bookkeeping (llama-kv-cells.h, llama-kv-cache.cpp).

Every cell has a position (-1: empty) and the set of sequences that use it, so one cell can serve several
sequences (a shared prompt prefix copied with seq_cp). A batch's tokens go to free cells (first fit: the
lowest free cells, so one sequence alone writes cells 0, 1, 2, ... and its steps match the single-sequence
layout exactly), and a token sees a cell when the cell belongs to the token's (first) sequence and is at or
before its position, within the sliding window if its layer has one. Positions moved by seq_add / seq_div
leave a per-cell `shift` that the model applies to the cached keys (a RoPE rotation) before its next step.
For M-RoPE models each cell also keeps `rope_next`, the time position the token after it takes (its own plus
one for text; after an image's rows, the image's start plus its longer side, as mtmd counts an image's positions).

The sequence operations keep llama.cpp's semantics: p0 < 0 means 0, p1 < 0 means no upper bound, a range
is [p0, p1); seq_rm with seq_id -1 removes the cells of every sequence; a cell whose position goes below 0
under seq_add is freed. One difference: seq_div records the shift as new - old position (the rotation that
moves the cached key there); llama.cpp 0.3.36's pos_div records old - new.
"""

from __future__ import annotations

import numpy as np

from pyggml.errors import ParameterError
from pyggml.models.llm.kv_cache import N_KV_PAD

NO_LIMIT = np.iinfo(np.int64).max


class KVCells:
    def __init__(self, size: int, n_seq_max: int = 1):
        if n_seq_max < 1:
            raise ParameterError(f"n_seq_max must be >= 1, got {n_seq_max}")
        self.size = size
        self.n_seq_max = n_seq_max
        self.pos = np.full(size, -1, dtype=np.int64)
        self.seq = np.zeros((size, n_seq_max), dtype=bool)
        self.shift = np.zeros(size, dtype=np.int64)
        self.rope_next = np.zeros(size, dtype=np.int64)

    # ----- state ---------------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        """Cells that hold a token of some sequence."""
        return int((self.pos >= 0).sum())

    @property
    def has_shift(self) -> bool:
        return bool(self.shift.any())

    def n_kv(self, extra: int = 0) -> int:
        """Cells a step attends: up to the last used cell, padded to N_KV_PAD, at most the cache size."""
        used = np.flatnonzero(self.pos >= 0)
        n_used = max(int(used[-1]) + 1 if used.size else 0, extra)
        return min(self.size, -(-n_used // N_KV_PAD) * N_KV_PAD)

    def check_seq(self, seq_id: int, allow_all: bool = False) -> int:
        low = -1 if allow_all else 0
        if isinstance(seq_id, bool) or not isinstance(seq_id, (int, np.integer)) or not low <= seq_id < self.n_seq_max:
            raise ParameterError(f"sequence id {seq_id!r} is outside [{low}, {self.n_seq_max}) (n_seq_max "
                                 f"{self.n_seq_max})")
        return int(seq_id)

    def seq_pos_min(self, seq_id: int) -> int:
        """The smallest position of the sequence's cells, -1 when it has none."""
        p = self.pos[self.seq[:, self.check_seq(seq_id)]]
        return int(p.min()) if p.size else -1

    def seq_pos_max(self, seq_id: int) -> int:
        """The largest position of the sequence's cells, -1 when it has none."""
        p = self.pos[self.seq[:, self.check_seq(seq_id)]]
        return int(p.max()) if p.size else -1

    def rope_delta(self, seq_id: int) -> int:
        """M-RoPE: how far the sequence's next time position is from its next position (0 without images)."""
        mine = np.flatnonzero(self.seq[:, self.check_seq(seq_id)])
        if not mine.size:
            return 0
        last = mine[np.argmax(self.pos[mine])]
        return int(self.rope_next[last] - self.pos[last] - 1)

    def seq_cells(self, seq_id: int) -> int:
        return int(self.seq[:, self.check_seq(seq_id)].sum())

    def exclusive(self, seq_id: int, p0: int = 0) -> int:
        """Cells that removing seq_id's positions >= p0 would free (no other sequence uses them)."""
        mine = self.seq[:, self.check_seq(seq_id)] & (self.pos >= p0)
        return int((mine & (self.seq.sum(axis=1) == 1)).sum())

    def seqs_beyond(self, n_seq_max: int) -> bool:
        """Whether a sequence id >= n_seq_max still has cells."""
        return bool(self.seq[:, n_seq_max:].any())

    def resized(self, n_seq_max: int) -> KVCells:
        """The same cells for sequence ids [0, n_seq_max) (the ids beyond must hold no cell)."""
        cells = KVCells(self.size, n_seq_max)
        n_keep = min(n_seq_max, self.n_seq_max)
        cells.pos[:], cells.shift[:], cells.rope_next[:] = self.pos, self.shift, self.rope_next
        cells.seq[:, :n_keep] = self.seq[:, :n_keep]
        return cells

    # ----- placing a batch -----------------------------------------------------------------------------
    def find_slot(self, n_tokens: int) -> np.ndarray | None:
        """The n lowest free cells, None if there are fewer."""
        free = np.flatnonzero(self.pos < 0)
        return free[:n_tokens] if free.size >= n_tokens else None

    def apply(self, cells: np.ndarray, positions, seq_ids) -> None:
        """Give cells[i] the position positions[i] and the sequences seq_ids[i] (a tuple of ids)."""
        for cell, p, ids in zip(cells, positions, seq_ids, strict=True):
            self.pos[cell] = p
            self.seq[cell] = False
            self.seq[cell, list(ids)] = True
            self.shift[cell] = 0
            self.rope_next[cell] = p + 1

    def free(self, cells: np.ndarray) -> None:
        self.pos[cells] = -1
        self.seq[cells] = False
        self.shift[cells] = 0

    def mask(self, positions: np.ndarray, first_seq: np.ndarray, n_kv: int, window: int | None = None,
             causal: bool = True) -> np.ndarray:
        """[n_tokens, n_kv] F32 of 0 (visible) and -inf: token i sees cell j when j holds a position at or
        before its own of the token's first sequence (within the window: llama.cpp's LLAMA_SWA_TYPE_STANDARD);
        not causal (llama_set_causal_attn false: Gemma 3's image tokens), any position of that sequence."""
        q = np.asarray(positions, dtype=np.int64)[:, None]
        k = self.pos[None, :n_kv]
        visible = self.seq[:n_kv, :].T[np.asarray(first_seq, dtype=np.int64)] & (k >= 0) & ((k <= q) | (not causal))
        if window is not None:
            visible &= q - k < window
        return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)

    # ----- llama.cpp's sequence operations -------------------------------------------------------------
    def _range(self, seq_id: int | None, p0: int, p1: int) -> np.ndarray:
        p0 = 0 if p0 < 0 else p0
        p1 = NO_LIMIT if p1 < 0 else p1
        hit = (self.pos >= p0) & (self.pos < p1)
        return hit if seq_id is None else hit & self.seq[:, seq_id]

    def clear(self) -> None:
        self.free(np.arange(self.size))

    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> bool:
        """Remove the sequence (every sequence when seq_id is -1) from the cells at positions [p0, p1); a
        cell left with no sequence becomes free. Always True, as llama.cpp's KV cache returns."""
        seq_id = self.check_seq(seq_id, allow_all=True)
        if seq_id < 0:
            self.free(self._range(None, p0, p1))
            return True
        hit = self._range(seq_id, p0, p1)
        self.seq[hit, seq_id] = False
        self.free(hit & ~self.seq.any(axis=1))
        return True

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """dst also uses the cells of src at positions [p0, p1) (no copy of keys or values: cells are shared)."""
        src, dst = self.check_seq(src), self.check_seq(dst)
        if src != dst:
            self.seq[self._range(src, p0, p1), dst] = True

    def seq_keep(self, seq_id: int) -> None:
        """Free every cell that seq_id does not use; the cells it uses keep only it."""
        seq_id = self.check_seq(seq_id)
        keep = self.seq[:, seq_id].copy()
        self.free(~keep & (self.pos >= 0))
        self.seq[keep] = False
        self.seq[keep, seq_id] = True

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Add delta to the positions of seq_id's cells in [p0, p1) (of every sequence sharing them, as in
        llama.cpp); a cell moved below position 0 is freed."""
        seq_id = self.check_seq(seq_id)
        if delta == 0:
            return
        hit = self._range(seq_id, p0, p1)
        self.pos[hit] += delta
        self.shift[hit] += delta
        self.free(hit & (self.pos < 0))

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        """Integer-divide the positions of seq_id's cells in [p0, p1) by d (llama.cpp's self-extend)."""
        seq_id = self.check_seq(seq_id)
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1:
            raise ParameterError(f"seq_div: the divisor must be an integer >= 1, got {d!r}")
        if d == 1:
            return
        hit = self._range(seq_id, p0, p1)
        new = self.pos[hit] // d
        self.shift[hit] += new - self.pos[hit]
        self.pos[hit] = new

    def clear_shift(self) -> None:
        """The pending per-cell position deltas are applied to the cached keys: forget them."""
        self.shift[:] = 0
