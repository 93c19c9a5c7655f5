"""The CPU device's extra buffer type "CPU_REPACK": quantized weights kept as their float32 values.

ggml's CPU offers extra buffer types (ggml_backend_dev_get_extra_bufts) whose buffers store weights in
a layout its kernels multiply faster; a tensor there keeps its type and shape, the bytes are converted
as they are written, and they cannot be read back. Here the faster layout is float32 rows: MUL_MAT and
the other products run straight on BLAS instead of dequantizing at every step. A tensor in such a buffer
is a Q4_K (or any dequantizable type) matrix to graphs, allocators and the scheduler; its buffer holds
4 bytes a value (`alloc_size`), and `Tensor.extra` is `REPACKED`, which the kernels that take weights
(products, get_rows) read through `values`. Like ggml's repack buffers, it is not host memory to the
rest of the system: tensor_get and memset refuse, and only the CPU backend computes with it.
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.base import BufferType, Status
from pyggml.backend.cpu.backend import TENSOR_ALIGNMENT, CpuBuffer
from pyggml.backend.cpu.kernels._common import REPACKED
from pyggml.backend.cpu.kernels._dequant_cache import dequantizable
from pyggml.core import types as T
from pyggml.core.host_memory import aligned_bytes
from pyggml.core.tensor import Tensor
from pyggml.errors import BackendError


def repackable(type_) -> bool:
    return T.is_quantized(type_) and dequantizable(type_)


class ConvertedBuffer(CpuBuffer):
    """A buffer whose tensors' bytes are converted as they are written (ggml's repack buffers): not host
    memory to the rest of the system, so no generic views, no read-back, no memset, no direct copy.
    `what` says, in the errors, what the conversion made of the bytes."""

    host_array = None  # the memory holds the conversion, not the tensors' bytes: no generic host views of it
    what = "converted"

    def _get_tensor(self, t: Tensor, out: memoryview, offset: int, size: int) -> None:
        raise BackendError(f"{self.buft.name}: {t.name!r} cannot be read back (its bytes were {self.what} as they "
                           f"were written, as in ggml's repack buffers)")

    def _memset_tensor(self, t: Tensor, value: int, offset: int, size: int) -> None:
        raise BackendError(f"{self.buft.name}: memset of {t.name!r} is not supported (only whole rows are written)")

    def _cpy_tensor(self, src: Tensor, dst: Tensor) -> bool:
        return False


class RepackBuffer(ConvertedBuffer):
    """float32 values of whole tensors, converted from their own type's bytes as rows are written.

    Thread-safety: as CpuBuffer (disjoint tensors may be written concurrently).
    """

    what = "converted to float32 values"

    def values(self, t: Tensor) -> np.ndarray:
        """t's float32 values, shape ne[::-1], in place (what the kernels multiply)."""
        start = self.offset_of(t)
        return self._host[start: start + t.nelements * 4].view(np.float32).reshape(tuple(reversed(t.ne)))

    def _init_tensor(self, t: Tensor) -> Status:
        if t.view_src is not None or not repackable(t.type):
            raise BackendError(f"buffer type CPU_REPACK holds whole quantized tensors; {t.name!r} is "
                               f"{'a view' if t.view_src is not None else T.type_name(t.type)}")
        t.extra = REPACKED
        return Status.SUCCESS

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        row = T.row_size(t.type, t.ne[0])
        if offset % row or size % row:
            raise BackendError(f"CPU_REPACK: writes to {t.name!r} must be whole rows of {row} bytes "
                               f"(got {size} bytes at offset {offset})")
        rows = np.frombuffer(data, np.uint8, count=size).reshape(-1, row)
        first = offset // row
        self.values(t).reshape(-1, t.ne[0])[first: first + rows.shape[0]] = T.to_float(t.type, rows)

class RepackBufferType(BufferType):
    """Thread-safety: alloc_buffer may be called from any thread."""

    name = "CPU_REPACK"
    alignment = TENSOR_ALIGNMENT
    is_host = False

    def _alloc_buffer(self, size: int) -> RepackBuffer:
        return RepackBuffer(self, aligned_bytes(size, fill=None))

    def _alloc_size(self, t: Tensor) -> int:
        return max(t.nelements * 4, t.nbytes) if repackable(t.type) else t.nbytes
