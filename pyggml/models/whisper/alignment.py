"""Word timestamps from the cross-attention of the alignment heads, by dynamic time warping (openai-whisper's
`find_alignment`, whisper.cpp's DTW token timestamps).

The decoder is run once more over `[sot..., <|notimestamps|>, text tokens, <|endoftext|>]`; the scores of the
alignment heads (the (layer, head) pairs the model file names) over the window's audio frames are soft-maxed,
normalised per frame over the tokens, median-filtered along time (width 7) and averaged over the heads. DTW
through minus that matrix pairs each token with a run of frames (20 ms each); a word starts at the frame where
its first token's run starts and ends where the next word's starts.
"""

from __future__ import annotations

import string
from dataclasses import dataclass

import numpy as np

MEDIAN_WIDTH = 7
SECONDS_PER_FRAME = 0.02   # encoder frames (1500 per 30 s)


@dataclass
class Word:
    start: float
    end: float
    word: str
    tokens: list[int]


def median_filter(x: np.ndarray, width: int) -> np.ndarray:
    """Median over a window of `width` along the last axis (reflected at the edges)."""
    pad = width // 2
    if x.shape[-1] <= pad:
        return x
    padded = np.pad(x, [(0, 0)] * (x.ndim - 1) + [(pad, pad)], mode="reflect")
    return np.median(np.lib.stride_tricks.sliding_window_view(padded, width, axis=-1), axis=-1)


def dtw(cost: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cheapest monotone path through cost [N, M] from (0, 0) to (N-1, M-1): (row indices, column indices)."""
    n, m = cost.shape
    total = np.full((n + 1, m + 1), np.inf)
    total[0, 0] = 0.0
    trace = np.zeros((n + 1, m + 1), dtype=np.int8)
    for j in range(1, m + 1):
        for i in range(1, n + 1):
            c0, c1, c2 = total[i - 1, j - 1], total[i - 1, j], total[i, j - 1]
            if c0 <= c1 and c0 <= c2:
                best, t = c0, 0
            elif c1 <= c2:
                best, t = c1, 1
            else:
                best, t = c2, 2
            total[i, j] = cost[i - 1, j - 1] + best
            trace[i, j] = t
    trace[0, :], trace[:, 0] = 2, 1
    i, j, rows, cols = n, m, [], []
    while i > 0 or j > 0:
        rows.append(i - 1)
        cols.append(j - 1)
        t = trace[i, j]
        i, j = (i - 1, j - 1) if t == 0 else (i - 1, j) if t == 1 else (i, j - 1)
    return np.array(rows[::-1]), np.array(cols[::-1])


def split_words(tok, tokens: list[int]) -> list[list[int]]:
    """Text tokens grouped into words: a token starting with a space starts a word, punctuation joins the word
    before it."""
    words: list[list[int]] = []
    for t in tokens:
        piece = tok.decode([t])
        if not words or (piece.startswith(" ") and piece.strip() not in string.punctuation):
            words.append([t])
        else:
            words[-1].append(t)
    return words


def word_timestamps(model, tok, heads: list[tuple[int, int]], start_tokens: list[int], text_tokens: list[int],
                    n_frames: int, offset: float = 0.0, slot: int = 0) -> list[Word]:
    """The words of `text_tokens` (decoded for the window the model has encoded into cross-attention slot
    `slot`, whose audio has n_frames mel frames) with their times, `offset` seconds added."""
    if not text_tokens or not heads:
        return []
    tokens = [*start_tokens, tok.notimestamps, *text_tokens, tok.eot]
    scores = model.cross_attention_scores(tokens, [layer for layer, _ in heads], slot)
    frames = max(min(n_frames // 2, model.n_audio_ctx), 1)
    w = np.stack([scores[layer][head, :, :frames] for layer, head in heads]).astype(np.float64)
    w = np.exp(w - w.max(axis=-1, keepdims=True))
    w /= w.sum(axis=-1, keepdims=True)
    w = (w - w.mean(axis=-2, keepdims=True)) / (w.std(axis=-2, keepdims=True) + 1e-10)
    matrix = median_filter(w, MEDIAN_WIDTH).mean(axis=0)[len(start_tokens):-1]   # <|notimestamps|> + text rows
    rows, cols = dtw(-matrix)
    jumps = np.concatenate([[True], np.diff(rows) > 0])
    jump_times = cols[jumps] * SECONDS_PER_FRAME                  # the frame where each row's run starts
    words = split_words(tok, text_tokens)
    bounds = np.concatenate([[0], np.cumsum([len(g) for g in words])])   # the last: the <|endoftext|> row
    return [Word(round(offset + float(jump_times[bounds[i]]), 3), round(offset + float(jump_times[bounds[i + 1]]), 3),
                 tok.decode(g), g) for i, g in enumerate(words)]
