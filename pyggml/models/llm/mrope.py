"""M-RoPE positions of a batch (Qwen2-VL's language model), as llama.cpp's mtmd and llama_batch give them: a text
token's four streams (time, height, width, extra) all hold its time position; an image's rows (a batch with a
grid of nx x ny tokens, read row by row) all take the time position t0 where the image starts, height t0 + row,
width t0 + column, extra 0, and the text after the image goes on at t0 + max(nx, ny) (mtmd_image_tokens_get_n_pos).

The cache's cells keep pyggml's consecutive positions (masks, sequence checks and reuse as for any model); the
time positions follow from each sequence's last cell (KVCells.rope_next).
"""

from __future__ import annotations

import numpy as np

from pyggml.models.llm.batch import Batch


def mrope_positions(cells, batch: Batch) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [4, n] the batch's positions stream by stream, int64 [n] each token's KVCells.rope_next), from the
    cells before the batch is placed."""
    pos = np.asarray(batch.positions, dtype=np.int64)
    delta = {s: cells.rope_delta(s) for s in {ids[0] for ids in batch.seq_ids}}
    time = pos + np.array([delta[ids[0]] for ids in batch.seq_ids], dtype=np.int64)
    if batch.grid is None:
        return np.tile(time, (4, 1)).astype(np.int32), time + 1
    nx, ny = batch.grid
    t0 = time[0]
    row, col = np.divmod(pos - pos[0], nx)
    streams = np.stack([np.full_like(pos, t0), t0 + row, t0 + col, np.zeros_like(pos)])
    return streams.astype(np.int32), np.full_like(pos, t0 + max(nx, ny))
