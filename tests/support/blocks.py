"""Random rows of ggml block types for kernel tests: random quants, finite fp16 scales (some zero), MXFP4's E8M0
exponents around 2^0 (the subnormal ones 0 and 1 among them)."""

from __future__ import annotations

import numpy as np

from pyggml.core import types as T
from pyggml.core.types import GGMLType as G

# byte offsets of the fp16 scales (d, and dmin/m where the type has one) inside a block
FP16_FIELDS = {G.Q4_0: (0,), G.Q4_1: (0, 2), G.Q5_0: (0,), G.Q5_1: (0, 2), G.Q8_0: (0,), G.Q2_K: (80, 82),
               G.Q3_K: (108,), G.Q4_K: (0, 2), G.Q5_K: (0, 2), G.Q6_K: (208,), G.IQ4_NL: (0,), G.IQ4_XS: (0,),
               G.MXFP4: ()}
E8M0_FIELDS = {G.MXFP4: 0}  # byte offset of the E8M0 exponent
BLOCK_TYPES = tuple(FP16_FIELDS)


def random_rows(type_, nrows: int, ne0: int, rng: np.random.Generator, zero_share: float = 0.05) -> np.ndarray:
    """(nrows, row bytes) uint8 of type_: F16/BF16 values ~N(0, 1), block types random bytes with scales
    ~0.01·N(0, 1) of which `zero_share` are exactly zero (E8M0 exponents: 2^-10 .. 2^2, `zero_share` of them
    0 or 1, ggml's subnormal scales)."""
    type_ = T.as_type(type_)
    if type_ in (G.F16, G.BF16):
        values = rng.standard_normal((nrows, ne0)).astype(np.float32)
        return T.from_float(type_, values).reshape(nrows, -1).view(np.uint8)
    per_block, size = T.block_traits(type_)
    raw = rng.integers(0, 256, (nrows, ne0 // per_block, size), dtype=np.uint8)
    for at in FP16_FIELDS[type_]:
        scale = (rng.standard_normal(raw.shape[:2]) * 0.01).astype(np.float16)
        scale[rng.random(scale.shape) < zero_share] = 0
        raw[:, :, at:at + 2] = scale[..., None].view(np.uint8).reshape(*scale.shape, 2)
    if type_ in E8M0_FIELDS:
        exponents = rng.integers(117, 130, raw.shape[:2], dtype=np.uint8)
        tiny = rng.random(exponents.shape) < zero_share
        exponents[tiny] = rng.integers(0, 2, int(tiny.sum()), dtype=np.uint8)
        raw[:, :, E8M0_FIELDS[type_]] = exponents
    return raw.reshape(nrows, -1)


def reference_values(type_, rows: np.ndarray, ne0: int) -> np.ndarray:
    """float32 values of rows by gguf's NumPy dequantization (the reference every kernel is checked against)."""
    type_ = T.as_type(type_)
    if type_ in (G.F16, G.BF16):
        return T.to_float(type_, rows.view(T.numpy_dtype(type_))).reshape(rows.shape[0], ne0)
    return T.to_float(type_, rows).reshape(rows.shape[0], ne0)
