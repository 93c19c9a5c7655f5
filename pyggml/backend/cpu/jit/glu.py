"""GLU (act(x) * gate) over float32 rows for GEGLU (ggml's F16-table GELU), SWIGLU and REGLU, as
kernels/unary.py computes them."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import f16_bits
from pyggml.backend.cpu.jit.floatbits import expf

GEGLU, SWIGLU, REGLU = 0, 1, 2  # the activations compiled here (the `kind` argument)


@jit
def glu_rows(x: np.ndarray, gate: np.ndarray, out: np.ndarray, kind: np.intp, gelu_table: np.ndarray) -> None:
    """out = act(x) * gate for 2-D arrays of the same shape (rows may be strided, values contiguous).

    GEGLU reads ggml's GELU table at x rounded to F16, except 0 at x <= -10 and x itself at x >= 10."""
    n = np.uintp(x.shape[1])
    for r in range(np.uintp(x.shape[0])):
        for i in range(n):
            v = x[r, i]
            if kind == GEGLU:
                if v <= np.float32(-10):
                    act = np.float32(0)
                elif v >= np.float32(10):
                    act = v
                else:
                    act = gelu_table[f16_bits(v)]
            elif kind == SWIGLU:
                act = v / (np.float32(1) + expf(-v))
            else:
                act = v if v > np.float32(0) else np.float32(0)
            out[r, i] = act * gate[r, i]
