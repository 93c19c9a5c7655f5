"""ggml tensor types: numbering, block sizes, and conversion to and from float.

The numbering and the (block size, type size) pairs are ggml's own (ggml.h's enum ggml_type, ggml.c's type
traits), which GGUF files share; tests/core/test_types.py holds them to the `gguf` package's tables. That package
is imported only where quantized blocks are converted with `gguf.quants` (vectorised NumPy): its import, with its
writer and YAML, took 35 ms of every start.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from pyggml.errors import UnsupportedTypeError

# (name, number, elements per block, bytes per block)
_TYPES = (("F32", 0, 1, 4), ("F16", 1, 1, 2), ("Q4_0", 2, 32, 18), ("Q4_1", 3, 32, 20), ("Q5_0", 6, 32, 22),
          ("Q5_1", 7, 32, 24), ("Q8_0", 8, 32, 34), ("Q8_1", 9, 32, 40), ("Q2_K", 10, 256, 84),
          ("Q3_K", 11, 256, 110), ("Q4_K", 12, 256, 144), ("Q5_K", 13, 256, 176), ("Q6_K", 14, 256, 210),
          ("Q8_K", 15, 256, 292), ("IQ2_XXS", 16, 256, 66), ("IQ2_XS", 17, 256, 74), ("IQ3_XXS", 18, 256, 98),
          ("IQ1_S", 19, 256, 50), ("IQ4_NL", 20, 32, 18), ("IQ3_S", 21, 256, 110), ("IQ2_S", 22, 256, 82),
          ("IQ4_XS", 23, 256, 136), ("I8", 24, 1, 1), ("I16", 25, 1, 2), ("I32", 26, 1, 4), ("I64", 27, 1, 8),
          ("F64", 28, 1, 8), ("IQ1_M", 29, 256, 56), ("BF16", 30, 1, 2), ("TQ1_0", 34, 256, 54),
          ("TQ2_0", 35, 256, 66), ("MXFP4", 39, 32, 17), ("NVFP4", 40, 64, 36), ("Q1_0", 41, 128, 18))

GGMLType = IntEnum("GGMLType", {name: number for name, number, _, _ in _TYPES})
GGMLType.__doc__ = "ggml_type, with ggml's numbering (F32 = 0, F16 = 1, Q4_0 = 2, ...)."

_PLAIN_DTYPES = {
    GGMLType.F32: np.dtype(np.float32),
    GGMLType.F16: np.dtype(np.float16),
    GGMLType.F64: np.dtype(np.float64),
    GGMLType.I8: np.dtype(np.int8),
    GGMLType.I16: np.dtype(np.int16),
    GGMLType.I32: np.dtype(np.int32),
    GGMLType.I64: np.dtype(np.int64),
    GGMLType.BF16: np.dtype(np.uint16),  # raw bits; see bf16_to_f32
}


def as_type(t) -> GGMLType:
    """Accept a GGMLType, a gguf type, an int or a name ("f32", "Q4_K") and return the GGMLType."""
    if isinstance(t, GGMLType):
        return t
    try:
        if isinstance(t, str):
            return GGMLType[t.upper()]
        return GGMLType(int(t))
    except (KeyError, ValueError):
        raise UnsupportedTypeError(f"unknown ggml type {t!r}; known: {', '.join(m.name for m in GGMLType)}") from None


_TRAITS: dict[GGMLType, tuple[int, int]] = {GGMLType(number): (elements, size) for _, number, elements, size in _TYPES}
"""(elements, bytes) per block. Looked up directly: sizes are asked for on every tensor built and placed,
and an int or a GGMLType finds its entry without a conversion (IntEnum members hash as their values)."""


def block_traits(t) -> tuple[int, int]:
    """(elements per block, bytes per block)."""
    traits = _TRAITS.get(t) if not isinstance(t, str) else None
    return traits if traits is not None else _TRAITS[as_type(t)]


def blck_size(t) -> int:
    """Elements per block (1 for plain types, 32 or 256 for most quant types)."""
    return block_traits(t)[0]


def type_size(t) -> int:
    """Bytes per block."""
    return block_traits(t)[1]


def type_name(t) -> str:
    """ggml_type_name: lower-case for plain types ("f32"), upper-case for quant types ("q4_K" in ggml; here the
    enum name)."""
    t = as_type(t)
    return t.name.lower() if t in _PLAIN_DTYPES else t.name


def is_quantized(t) -> bool:
    return blck_size(t) > 1


def row_size(t, ne0: int) -> int:
    """Bytes of one row of ne0 elements; ne0 must be a whole number of blocks."""
    bs = blck_size(t)
    if ne0 % bs:
        raise UnsupportedTypeError(f"row of {ne0} elements is not a whole number of {as_type(t).name} blocks of {bs}")
    return type_size(t) * (ne0 // bs)


def numpy_dtype(t) -> np.dtype:
    """The NumPy dtype that holds one element of a plain type (BF16 as raw uint16 bits)."""
    t = as_type(t)
    try:
        return _PLAIN_DTYPES[t]
    except KeyError:
        raise UnsupportedTypeError(f"{t.name} is a block type and has no per-element NumPy dtype") from None


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to nearest even, NaN kept quiet: ggml_compute_fp32_to_bf16."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    nan = (bits & 0x7FFFFFFF) > 0x7F800000
    rounded = ((bits + (0x7FFF + ((bits >> 16) & 1))) >> 16).astype(np.uint16)
    return np.where(nan, ((bits >> 16) | 64).astype(np.uint16), rounded)


def to_float(t, data: np.ndarray, ne0: int | None = None) -> np.ndarray:
    """Convert elements (plain types) or raw block bytes of rows (quant types) to float32.

    For a quant type, `data` is a uint8 array whose last axis holds whole rows of blocks;
    the result's last axis has the elements of those rows.
    """
    t = as_type(t)
    if t == GGMLType.F32:
        return np.asarray(data, dtype=np.float32)
    if t == GGMLType.BF16:
        return bf16_to_f32(data)
    if t in _PLAIN_DTYPES:
        return np.asarray(data).astype(np.float32)
    from gguf import GGMLQuantizationType, quants

    try:
        return quants.dequantize(np.ascontiguousarray(data, dtype=np.uint8), GGMLQuantizationType(t)).astype(
            np.float32, copy=False
        )
    except NotImplementedError:
        raise UnsupportedTypeError(f"dequantization of {t.name} is not supported") from None


def from_float(t, x: np.ndarray) -> np.ndarray:
    """Convert float values to type t: elements for plain types, raw block bytes (uint8) of rows for quant types."""
    t = as_type(t)
    x = np.asarray(x, dtype=np.float32)
    if t == GGMLType.BF16:
        return f32_to_bf16(x)
    if t in _PLAIN_DTYPES:
        dt = _PLAIN_DTYPES[t]
        return x.astype(dt) if dt.kind == "f" else np.trunc(x).astype(dt)
    if x.shape[-1] % blck_size(t):
        raise UnsupportedTypeError(f"rows of {x.shape[-1]} values are not whole {t.name} blocks of {blck_size(t)}")
    from gguf import GGMLQuantizationType, quants

    try:
        return quants.quantize(x, GGMLQuantizationType(t))
    except NotImplementedError:
        raise UnsupportedTypeError(f"quantization to {t.name} is not supported") from None


def encode(t, values: np.ndarray) -> np.ndarray:
    """Values as stored in memory for type t: plain NumPy values kept exact (ints stay ints), floats converted."""
    t = as_type(t)
    values = np.asarray(values)
    if t in _PLAIN_DTYPES and t != GGMLType.BF16:
        return values.astype(_PLAIN_DTYPES[t])
    return from_float(t, values)
