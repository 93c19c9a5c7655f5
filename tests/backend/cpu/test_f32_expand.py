"""The CPU device's extra buffer type CPU_F32: quantized weights expanded to their float32 values."""

import numpy as np
import pytest

from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.backend import init_by_name, tensor_get, tensor_set
from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.kernels._common import F32_EXPANDED
from pyggml.core import Context, GGMLType, ops
from pyggml.core import types as T
from pyggml.core.tensor import host_ndarray
from pyggml.errors import BackendError

Q = GGMLType.Q8_0


@pytest.fixture
def cpu():
    return init_by_name("CPU")


def _weight_bytes(rows: int, cols: int) -> np.ndarray:
    values = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    return T.from_float(Q, values)


def _placed(cpu, raw: np.ndarray, buft):
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_2d(Q, 256, raw.shape[0], "w")
    buffer = alloc_ctx_tensors_from_buft(ctx, buft)
    tensor_set(w, raw)
    return w, buffer


def test_the_cpu_device_offers_it_and_its_backend_computes_with_it(cpu):
    expanded, interleaved = cpu.device.extra_buffer_types()
    assert interleaved.name == "CPU_INTERLEAVED" and cpu.supports_buft(interleaved)
    assert expanded.name == "CPU_F32" and not expanded.is_host and cpu.supports_buft(expanded)
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_2d(Q, 256, 8, "w")
    assert expanded.alloc_size(w) == 256 * 8 * 4 > w.nbytes


def test_values_are_the_dequantized_rows_written_in_slabs(cpu):
    raw = _weight_bytes(8, 256)
    ctx = Context(no_alloc=True)
    w = ctx.new_tensor_2d(Q, 256, 8, "w")
    alloc_ctx_tensors_from_buft(ctx, cpu.device.extra_buffer_types()[0])
    row = raw.shape[1]
    tensor_set(w, raw[5:], 5 * row, 3 * row)  # rows 5..7 first, then 0..4: any order of whole rows
    tensor_set(w, raw[:5], 0, 5 * row)
    assert w.type == Q and w.extra is F32_EXPANDED
    np.testing.assert_array_equal(w.buffer.values(w)[0, 0], T.to_float(Q, raw))


def test_products_and_get_rows_equal_those_of_the_quantized_bytes(cpu):
    """The same values either way: get_rows is bit-identical, products differ only by float32 summation order."""
    raw = _weight_bytes(16, 256)
    expanded, _ = _placed(cpu, raw, cpu.device.extra_buffer_types()[0])
    plain, _ = _placed(cpu, raw, cpu.default_buffer_type)
    ctx = Context()
    x = ctx.new_tensor_2d(GGMLType.F32, 256, 3, "x")
    host_ndarray(x)[...] = np.random.default_rng(1).standard_normal((1, 1, 3, 256))
    ids = ctx.new_tensor_1d(GGMLType.I32, 4, "ids")
    host_ndarray(ids)[...] = [3, 0, 15, 3]
    for build, rtol in ((lambda w: ops.mul_mat(ctx, w, x), 1e-5), (lambda w: ops.get_rows(ctx, w, ids), 0)):
        a, b = build(expanded), build(plain)
        kernels.compute(a)
        kernels.compute(b)
        np.testing.assert_allclose(host_ndarray(a), host_ndarray(b), rtol=rtol,
                                   atol=rtol * np.abs(host_ndarray(b)).max())


def test_it_refuses_reads_partial_rows_and_tensors_it_cannot_hold(cpu):
    raw = _weight_bytes(4, 256)
    w, _ = _placed(cpu, raw, cpu.device.extra_buffer_types()[0])
    with pytest.raises(BackendError, match="cannot be read back"):
        tensor_get(w)
    with pytest.raises(BackendError, match="whole rows"):
        tensor_set(w, raw.reshape(-1)[:100], 0, 100)
    ctx = Context(no_alloc=True)
    ctx.new_tensor_1d(GGMLType.F32, 8, "norm")
    with pytest.raises(BackendError, match="holds whole quantized tensors"):
        alloc_ctx_tensors_from_buft(ctx, cpu.device.extra_buffer_types()[0])
