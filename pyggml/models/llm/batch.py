"""A batch of tokens of several sequences for one decode call (llama.cpp's llama_batch).

Each token has a position, the sequences it belongs to (usually one; a shared prompt token may belong to
several) and a flag saying whether its logits are wanted. `Model.decode_batch` checks the batch against
the cache as llama.cpp's llama_batch_allocr does: known sequence ids, and per sequence positions that are
consecutive and continue the positions already cached.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from pyggml.errors import ParameterError


@dataclass
class Batch:
    tokens: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)
    seq_ids: list[tuple[int, ...]] = field(default_factory=list)
    logits: list[bool] = field(default_factory=list)
    embd: np.ndarray | None = None  # float32 [n_tokens, n_embd] rows fed in place of the tokens (llama_batch.embd)
    causal: bool = True  # False: each token attends every position of its sequence (llama_set_causal_attn)
    grid: tuple | None = None  # (nx, ny): the embedding rows are an image's tokens, row by row (M-RoPE positions)

    def add(self, token: int, pos: int, seq_ids: int | Sequence[int], logits: bool = False) -> None:
        """Append one token (llama.cpp's common_batch_add)."""
        ids = (seq_ids,) if isinstance(seq_ids, (int, np.integer)) else tuple(seq_ids)
        if not ids:
            raise ParameterError("Batch.add: a token needs at least one sequence id")
        self.tokens.append(int(token))
        self.positions.append(int(pos))
        self.seq_ids.append(tuple(int(s) for s in ids))
        self.logits.append(bool(logits))

    @classmethod
    def sequence(cls, ids: Sequence[int], pos0: int, seq_id: int = 0, all_logits: bool = False) -> Batch:
        """Tokens of one sequence at pos0, pos0 + 1, ...; logits for the last (or, all_logits, every) token."""
        batch = cls()
        for i, t in enumerate(ids):
            batch.add(t, pos0 + i, seq_id, all_logits or i == len(ids) - 1)
        return batch

    @classmethod
    def embeddings(cls, rows: np.ndarray, pos0: int, seq_id: int = 0, all_logits: bool = False) -> Batch:
        """Embedding rows (an image's) of one sequence at pos0, pos0 + 1, ...; their token ids are unused zeros.
        Rows that carry a `grid` (pyggml.models.vision.prompt.ImageRows) give it to the batch."""
        batch = cls.sequence([0] * len(rows), pos0, seq_id, all_logits)
        batch.grid = getattr(rows, "grid", None)
        batch.embd = np.ascontiguousarray(rows, dtype=np.float32)
        return batch

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_outputs(self) -> int:
        return sum(self.logits)

    def check(self, n_vocab: int, cells) -> None:
        """ParameterError for a token outside the vocabulary, an unknown sequence id, or positions of a
        sequence that are not consecutive or do not continue the cached ones (llama_batch_allocr::init)."""
        if not (len(self.tokens) == len(self.positions) == len(self.seq_ids) == len(self.logits)):
            raise ParameterError("Batch: tokens, positions, seq_ids and logits must have one entry per token")
        if self.embd is not None and self.embd.shape[0] != len(self.tokens):
            raise ParameterError(f"Batch: {self.embd.shape[0]} embedding rows for {len(self.tokens)} tokens")
        if self.grid is not None and (self.embd is None or self.grid[0] * self.grid[1] != len(self.tokens)
                                      or len({ids for ids in self.seq_ids}) != 1):
            raise ParameterError(f"Batch: an image grid {self.grid} needs that many embedding rows of one sequence, "
                                 f"got {len(self.tokens)}")
        bad = [t for t in self.tokens if not 0 <= t < n_vocab]
        if bad:
            raise ParameterError(f"Batch: token id {bad[0]} is outside the vocabulary [0, {n_vocab})")
        per_seq: dict[int, list[int]] = {}
        for pos, ids in zip(self.positions, self.seq_ids, strict=True):
            for s in ids:
                per_seq.setdefault(cells.check_seq(s), []).append(pos)
        for s, pos in per_seq.items():
            last = cells.seq_pos_max(s)
            if last >= 0 and min(pos) != last + 1:
                raise ParameterError(f"Batch: sequence {s} continues at position {min(pos)}, but its last cached "
                                     f"position is {last}; positions must stay consecutive (Y = X + 1)")
            if max(pos) - min(pos) + 1 != len(pos) or len(set(pos)) != len(pos):
                raise ParameterError(f"Batch: the positions of sequence {s} are not consecutive: {sorted(pos)}")


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens a and b share."""
    n = min(len(a), len(b))
    diff = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(diff[0]) if diff.size else n
