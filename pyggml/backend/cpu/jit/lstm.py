"""The LSTM op's steps in one compiled loop (kernels/recurrent.py): each step's product as H contiguous rows of 4H
added (a loop that vectorises, where 4H dot products of H would sum one value at a time), the gates with an exp
that vectorises."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.floatbits import expf


@jit(inline="always")
def sigmoid(v: np.float32) -> np.float32:
    return np.float32(1) / (np.float32(1) + expf(-v))


@jit(inline="always")
def tanh(v: np.float32) -> np.float32:
    """(1 - e) / (1 + e) with e = exp(-2|v|), the sign of v: no overflow, within 2e-7 of tanh."""
    e = expf(np.float32(-2) * abs(v))
    r = (np.float32(1) - e) / (np.float32(1) + e)
    return r if v >= np.float32(0) else -r


@jit
def lstm_f32(gates_x: np.ndarray, w_hh: np.ndarray, state: np.ndarray, out: np.ndarray) -> None:
    """out[t] = h after step t of gates_x [n, 4H] with w_hh [4H, H] from state [h; c]; out[n], out[n + 1] the
    final h and c (C-contiguous float32 arrays; gate order i, f, g, o)."""
    n, hidden = gates_x.shape[0], w_hh.shape[1]
    w_rows = np.ascontiguousarray(w_hh.T)  # [H, 4H]
    gates = np.empty(4 * hidden, np.float32)
    h, c = state[0].copy(), state[1].copy()
    for t in range(n):
        gates[:] = np.float32(0)
        for k in range(hidden):
            hk = h[k]
            for j in range(4 * hidden):
                gates[j] += w_rows[k, j] * hk
        for j in range(4 * hidden):
            gates[j] = gates_x[t, j] + gates[j]
        for j in range(hidden):
            c[j] = sigmoid(gates[hidden + j]) * c[j] + sigmoid(gates[j]) * tanh(gates[2 * hidden + j])
            h[j] = sigmoid(gates[3 * hidden + j]) * tanh(c[j])
        out[t] = h
    out[n] = h
    out[n + 1] = c
