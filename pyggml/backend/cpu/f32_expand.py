"""The CPU device's extra buffer type "CPU_F32": quantized weights expanded to their float32 values.

ggml's CPU offers extra buffer types (ggml_backend_dev_get_extra_bufts) whose buffers store weights in
a layout its kernels multiply faster; a tensor there keeps its type and shape, the bytes are converted
as they are written, and they cannot be read back. Here the faster layout is float32 rows: MUL_MAT and
the other products run straight on BLAS instead of dequantizing at every step. A tensor in such a buffer
is a Q4_K (or any dequantizable type) matrix to graphs, allocators and the scheduler; its buffer holds
4 bytes a value (`alloc_size`), and `Tensor.extra` is `F32_EXPANDED`, which the kernels that take weights
(products, get_rows) read through `values`. Like ggml's extra buffers, it is not host memory to the
rest of the system: tensor_get and memset refuse, and only the CPU backend computes with it. It is what
`load_model(weights="f32")` and `pyggml generate --weights f32` ask for; ggml's own CPU_REPACK (an
interleaved layout for integer products) is CPU_INTERLEAVED here (interleave.py).
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.base import BufferType, Status
from pyggml.backend.cpu.buffer import TENSOR_ALIGNMENT, ConvertedBuffer
from pyggml.backend.cpu.kernels._common import F32_EXPANDED
from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.core import types as T
from pyggml.core.host_memory import aligned_bytes, map_for_reading
from pyggml.core.tensor import Tensor
from pyggml.errors import BackendError


def expandable(type_) -> bool:
    return T.is_quantized(type_) and dequantizable(type_)


class F32ExpandedBuffer(ConvertedBuffer):
    """float32 values of whole tensors, converted from their own type's bytes as rows are written.

    Thread-safety: as CpuBuffer (disjoint tensors may be written concurrently).
    """

    what = "converted to float32 values"

    def values(self, t: Tensor) -> np.ndarray:
        """t's float32 values, shape ne[::-1], in place (what the kernels multiply)."""
        start = self.offset_of(t)
        return self._host[start: start + t.nelements * 4].view(np.float32).reshape(tuple(reversed(t.ne)))

    def _init_tensor(self, t: Tensor) -> Status:
        if t.view_src is not None or not expandable(t.type):
            raise BackendError(f"buffer type CPU_F32 holds whole quantized tensors; {t.name!r} is "
                               f"{'a view' if t.view_src is not None else T.type_name(t.type)}")
        t.extra = F32_EXPANDED
        return Status.SUCCESS

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        row = T.row_size(t.type, t.ne[0])
        if offset % row or size % row:
            raise BackendError(f"CPU_F32: writes to {t.name!r} must be whole rows of {row} bytes "
                               f"(got {size} bytes at offset {offset})")
        rows = np.frombuffer(data, np.uint8, count=size).reshape(-1, row)
        map_for_reading(rows)
        first = offset // row
        self.values(t).reshape(-1, t.ne[0])[first: first + rows.shape[0]] = T.to_float(t.type, rows)


class F32ExpandedBufferType(BufferType):
    """Thread-safety: alloc_buffer may be called from any thread."""

    name = "CPU_F32"
    alignment = TENSOR_ALIGNMENT
    is_host = False

    def _alloc_buffer(self, size: int) -> F32ExpandedBuffer:
        return F32ExpandedBuffer(self, aligned_bytes(size, fill=None))

    def _alloc_size(self, t: Tensor) -> int:
        return max(t.nelements * 4, t.nbytes) if expandable(t.type) else t.nbytes
