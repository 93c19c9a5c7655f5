"""ggml's F16-table GELU (GGML_GELU_FP16, as kernels/unary.py and jit/glu.py compute it) over float32 rows, in
two passes per row: the table indices (the values rounded to F16: vector code), then the lookups with ggml's
cut-offs (0 at v <= -10, v itself at v >= 10). One loop doing both ran 1.4x slower, its gathers waiting on the
rounding (SigLIP's FFN: 3M values a layer)."""

from __future__ import annotations

import numpy as np

from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.f16 import f16_bits_small


@jit(inline="always")
def _cut_off(v: np.float32, act: np.float32) -> np.float32:
    """The table's value act at v, except 0 at v <= -10 and v at v >= 10 (ggml_vec_gelu_f32)."""
    act = np.float32(0) if v <= np.float32(-10) else act
    return v if v >= np.float32(10) else act


@jit
def gelu_table_rows(x: np.ndarray, out: np.ndarray, table: np.ndarray) -> None:
    """out = GELU(x) for 2-D float32 arrays of the same shape (rows may be strided, values contiguous), or in place
    when out is x; table: ggml's GELU table as float32 (kernels/unary.py's f16_table(gelu_tanh))."""
    n = np.uintp(x.shape[1])
    at = np.empty(n, np.uint32)
    in_place = x.ctypes.data == out.ctypes.data  # one array in the loop: two that alias pick LLVM's scalar loop
    for r in range(np.uintp(x.shape[0])):
        for i in range(n):
            at[i] = f16_bits_small(x[r, i])
        if in_place:
            for i in range(n):
                x[r, i] = _cut_off(x[r, i], table[at[i]])
        else:
            for i in range(n):
                out[r, i] = _cut_off(x[r, i], table[at[i]])
