import numpy as np
import pytest

from pyggml.core import types as T
from pyggml.errors import UnsupportedTypeError


def test_numbering_and_sizes_are_ggmls():
    assert T.GGMLType.F32 == 0 and T.GGMLType.F16 == 1 and T.GGMLType.Q4_0 == 2 and T.GGMLType.Q8_0 == 8
    assert T.GGMLType.Q4_K == 12 and T.GGMLType.I32 == 26 and T.GGMLType.BF16 == 30 and T.GGMLType.MXFP4 == 39
    assert (T.blck_size("q4_0"), T.type_size("q4_0")) == (32, 18)
    assert (T.blck_size(T.GGMLType.Q6_K), T.type_size(T.GGMLType.Q6_K)) == (256, 210)
    assert T.row_size(T.GGMLType.Q8_0, 64) == 68
    assert T.type_name(T.GGMLType.F32) == "f32" and T.is_quantized(T.GGMLType.Q5_0)


def test_table_is_the_gguf_packages():
    """pyggml's own table (kept so that `import pyggml` needs no `gguf`) against the package GGUF files are written
    with: every type both know has the same number and block traits (a type a later gguf adds is unknown to pyggml
    until it has kernels for it: a file of that type is refused when parsed)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    ours = {t.name: (int(t), T.block_traits(t)) for t in T.GGMLType}
    theirs = {t.name: (int(t), GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType}
    both = theirs.keys() & ours.keys()
    assert len(both) >= 31  # gguf 0.17's types, the oldest the project takes
    assert {name: ours[name] for name in both} == {name: theirs[name] for name in both}


def test_unknown_types_and_bad_rows_raise():
    with pytest.raises(UnsupportedTypeError, match="unknown ggml type"):
        T.as_type(5)
    with pytest.raises(UnsupportedTypeError, match="unknown ggml type"):
        T.as_type("q4_2")
    with pytest.raises(UnsupportedTypeError, match="whole number"):
        T.row_size(T.GGMLType.Q4_0, 33)
    with pytest.raises(UnsupportedTypeError, match="block type"):
        T.numpy_dtype(T.GGMLType.Q4_K)


def test_bf16_round_trip_rounds_to_nearest_even():
    x = np.array([1.0, -2.5, 3.14159, 1e-40, np.inf, np.nan], dtype=np.float32)
    y = T.to_float(T.GGMLType.BF16, T.from_float(T.GGMLType.BF16, x))
    assert np.allclose(y[:4], x[:4], rtol=1 / 128, atol=1e-38) and np.isinf(y[4]) and np.isnan(y[5])
    # 1 + 2^-8 is exactly half way between two bf16 values: ties go to even (1.0)
    assert T.from_float(T.GGMLType.BF16, np.float32(1 + 2 ** -8)) == 0x3F80


@pytest.mark.parametrize("name", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"])
def test_quant_round_trip_is_close(name):
    rng = np.random.default_rng(0)
    x = rng.uniform(-1, 1, size=(4, 256)).astype(np.float32)
    q = T.from_float(name, x)
    assert q.dtype == np.uint8 and q.shape == (4, T.row_size(name, 256))
    y = T.to_float(name, q)
    nmse = np.sum((x - y) ** 2) / np.sum(x ** 2)
    assert nmse < 5e-3


def test_types_without_a_quantizer_say_so():
    with pytest.raises(UnsupportedTypeError, match="quantization to Q4_K is not supported"):
        T.from_float("Q4_K", np.zeros((1, 256), np.float32))
    # dequantization of K-quants works: an all-zero block is zero
    assert not T.to_float("Q4_K", np.zeros((1, 144), np.uint8)).any()


def test_encode_keeps_integers_exact():
    big = np.array([2 ** 31 - 1, -(2 ** 31)], dtype=np.int64)
    assert (T.encode(T.GGMLType.I32, big) == big).all()
