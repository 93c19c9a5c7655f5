"""Allocating whole contexts (weights, KV caches): ggml's alloc_ctx_tensors family.

The context's tensors are packed in creation order into ranges of at most the buffer type's max_size;
each range becomes one buffer filled by a TensorAllocator, and several ranges come back as one
multi-buffer. A single tensor larger than max_size gets a range of its own.
"""

from __future__ import annotations

from pyggml.alloc.tallocr import TensorAllocator
from pyggml.backend.base import Backend, Buffer, BufferType, Status
from pyggml.backend.multi_buffer import multi_buffer
from pyggml.backend.tensor_io import view_init
from pyggml.core.context import Context
from pyggml.core.tensor import Tensor
from pyggml.errors import AllocationError


def _ranges(ctx: Context, buft: BufferType) -> list[tuple[int, int, int]]:
    """(first, end, size) per buffer: tensor index ranges and their padded byte totals."""
    if not ctx.no_alloc:
        raise AllocationError("alloc_ctx_tensors needs a no_alloc context; this one already gave its tensors memory")
    alignment, max_size = buft.alignment, buft.max_size
    ranges, first, size = [], 0, 0
    for k, t in enumerate(ctx.tensors):
        this = 0
        if t.data is None and t.view_src is None:
            this = -(-buft.alloc_size(t) // alignment) * alignment
        if size > 0 and size + this > max_size:
            ranges.append((first, k, size))
            first, size = k, this
        else:
            size += this
    if size > 0:
        ranges.append((first, len(ctx.tensors), size))
    return ranges


def alloc_ctx_tensors_from_buft_size(ctx: Context, buft: BufferType) -> int:
    """Bytes alloc_ctx_tensors_from_buft would allocate (the sum of its buffer sizes)."""
    return sum(size for _, _, size in _ranges(ctx, buft))


def _init_range(tensors: list[Tensor], buffer: Buffer, bound: list[tuple]) -> None:
    """Place the range's tensors and give its views their memory; `bound` keeps each touched tensor's old state."""
    talloc = TensorAllocator(buffer)
    for t in tensors:
        before = (t, t.buffer, t.data)
        if t.data is None and t.view_src is None:
            status = talloc.alloc(t)
        elif t.view_src is not None and t.buffer is None:
            status = view_init(t)
        else:
            continue
        bound.append(before)
        if status != Status.SUCCESS:
            raise AllocationError(f"failed to initialize tensor {t.name!r} in buffer {buffer.name}: {status.name}")


def alloc_ctx_tensors_from_buft(ctx: Context, buft: BufferType) -> Buffer | None:
    """Give every tensor of the context memory of this buffer type.

    Returns the buffer (a multi-buffer when max_size split the tensors), or None when no tensor needs
    memory. On failure every buffer made so far is freed, the tensors are unbound, and the error is raised.
    """
    buffers: list[Buffer] = []
    bound: list[tuple] = []
    try:
        for first, end, size in _ranges(ctx, buft):
            buffers.append(buft.alloc_buffer(size))
            _init_range(ctx.tensors[first:end], buffers[-1], bound)
    except BaseException:
        for t, buffer, data in bound:
            t.buffer, t.data = buffer, data
        for b in buffers:
            b.free()
        raise
    if not buffers:
        return None
    if len(buffers) == 1:
        return buffers[0]
    return multi_buffer(buffers)


def alloc_ctx_tensors(ctx: Context, backend: Backend) -> Buffer | None:
    """alloc_ctx_tensors_from_buft with the backend's default buffer type."""
    return alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
