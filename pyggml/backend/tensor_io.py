"""ggml's public tensor-data wrappers (ggml_backend_tensor_set/get/memset/copy, tensor_alloc, view_init).

Every check that ggml asserts is done here, before any byte moves, and raises an
exception from pyggml.errors naming the tensor, the sizes and the offsets; the
buffer and backend hooks then run on arguments that are known to be valid.

Data going in may be an ndarray (the common case: the tensor's dtype, any shape with
the right number of bytes; or raw uint8), or any buffer-protocol object (bytes,
bytearray, memoryview, mmap) taken as raw bytes. A full read comes back as an ndarray
shaped like the tensor (ne reversed; block types as uint8 rows), a partial read as raw
uint8 bytes.
"""

from __future__ import annotations

import numpy as np

from pyggml.backend.base import Backend, Buffer, Status
from pyggml.core import types as T
from pyggml.core.tensor import Tensor
from pyggml.errors import (AllocationError, BufferUseError, LayoutError, NotAllocatedError, OutOfBoundsError,
                           GGMLTypeError)

__all__ = ["tensor_buffer", "tensor_alloc", "view_init", "tensor_set", "tensor_get", "tensor_memset",
           "tensor_set_2d", "tensor_get_2d", "tensor_set_async", "tensor_get_async", "tensor_copy",
           "tensor_copy_async", "host_bytes"]


def tensor_buffer(t: Tensor) -> Buffer | None:
    """The buffer holding t's bytes: its root's for a view, as ggml reads it."""
    return t.view_src.buffer if t.view_src is not None else t.buffer


# ----------------------------------------------------------------------------------------------
# Placing tensors
# ----------------------------------------------------------------------------------------------
def tensor_alloc(buffer: Buffer, t: Tensor, addr: int) -> Status:
    """Bind t to `buffer` at address `addr` (base + offset), then let the buffer initialise it."""
    if t.view_src is not None:
        raise AllocationError(f"tensor_alloc: tensor {t.name!r} is a view of {t.view_src.name!r}; use view_init")
    if t.buffer is not None or t.data is not None:
        raise AllocationError(f"tensor_alloc: tensor {t.name!r} is already allocated "
                              f"(buffer {t.buffer!r}, data {t.data!r})")
    base = buffer.base
    if base is None and buffer.size:
        raise AllocationError(f"tensor_alloc: buffer {buffer.name} ({buffer.size} bytes) has no base address "
                              f"(a multi-buffer?); place tensor {t.name!r} in one of its buffers")
    base = base or 0
    size = buffer.alloc_size(t)
    if addr < base or addr + size > base + buffer.size:
        raise OutOfBoundsError(f"tensor_alloc: tensor {t.name!r} ({size} bytes) at offset {addr - base} does not "
                               f"fit buffer {buffer.name} of {buffer.size} bytes")
    return _bind(buffer, t, addr)


def view_init(t: Tensor) -> Status:
    """Give a view the buffer and address of its root (data = root.data + view_offs)."""
    if t.buffer is not None:
        raise AllocationError(f"view_init: tensor {t.name!r} already has buffer {t.buffer!r}")
    src = t.view_src
    if src is None:
        raise AllocationError(f"view_init: tensor {t.name!r} is not a view")
    if src.buffer is None or src.data is None:
        raise NotAllocatedError(f"view_init: view {t.name!r} of {src.name!r}: the source is not allocated")
    return _bind(src.buffer, t, src.data + t.view_offs)


def _bind(buffer: Buffer, t: Tensor, addr: int) -> Status:
    """Set buffer and data, undoing both if the buffer's init_tensor fails."""
    before = t.buffer, t.data
    t.buffer, t.data = buffer, addr
    try:
        return buffer.init_tensor(t)
    except BaseException:
        t.buffer, t.data = before
        raise


# ----------------------------------------------------------------------------------------------
# Checks shared by the wrappers
# ----------------------------------------------------------------------------------------------
def _bound_buffer(t: Tensor, what: str) -> Buffer:
    buf = tensor_buffer(t)
    if buf is None:
        raise NotAllocatedError(f"{what}: tensor {t.name!r} has no buffer (tensor buffer not set)")
    buf.check_alive()
    return buf


def _check_range(t: Tensor, what: str, offset: int, size: int) -> None:
    if t.data is None:
        raise NotAllocatedError(f"{what}: tensor {t.name!r} is not allocated (data is None)")
    if offset < 0 or size < 0 or offset + size > t.nbytes:
        raise OutOfBoundsError(f"{what}: {size} bytes at offset {offset} is out of bounds of tensor {t.name!r} "
                               f"({t.nbytes} bytes)")


def _layout(t: Tensor) -> tuple[tuple, tuple, np.dtype]:
    """Shape, strides and dtype of t as NumPy sees it (ne/nb reversed; block types as uint8 rows)."""
    if T.is_quantized(t.type):
        return ((t.ne[3], t.ne[2], t.ne[1], T.row_size(t.type, t.ne[0])), (t.nb[3], t.nb[2], t.nb[1], 1),
                np.dtype(np.uint8))
    return tuple(reversed(t.ne)), tuple(reversed(t.nb)), T.numpy_dtype(t.type)


def _typed(t: Tensor, raw: np.ndarray | None) -> np.ndarray:
    """t's values over `raw`, a copy of the bytes t spans (first to last byte, strides kept).

    Shaped like `Tensor.numpy()`: ne[:n_dims] reversed, leading size-1 dims dropped.
    """
    shape, strides, dtype = _layout(t)
    arr = np.empty(shape, dtype) if t.nbytes == 0 else np.ndarray(shape, dtype=dtype, buffer=raw, strides=strides)
    return arr.reshape(shape[len(shape) - t.numpy_ndim:])


def _check_dtype(t: Tensor, arr: np.ndarray, what: str) -> None:
    """Typed arrays must carry t's dtype; raw uint8 is always accepted."""
    if arr.dtype == np.uint8:
        return
    expected = _layout(t)[2]
    if arr.dtype != expected:
        raise GGMLTypeError(f"{what}: tensor {t.name!r} is {T.type_name(t.type)} ({expected}), got an array of "
                            f"{arr.dtype}; convert it or pass raw uint8 bytes")


def _as_bytes(obj, what: str, writable: bool = False) -> memoryview:
    try:
        view = memoryview(obj).cast("B")
    except (TypeError, ValueError) as e:
        raise GGMLTypeError(f"{what}: expected an ndarray or a C-contiguous buffer-protocol object, "
                            f"got {type(obj).__name__} ({e})") from None
    if writable and view.readonly:
        raise BufferUseError(f"{what}: the output object ({type(obj).__name__}) is read-only")
    return view


def _source(t: Tensor, data, offset: int, size: int | None, what: str) -> tuple[memoryview, int]:
    """(bytes to write, size), for writes at `offset`. size None means all of data."""
    if isinstance(data, np.ndarray):
        _check_dtype(t, data, what)
        if offset == 0 and size is None and data.dtype != np.uint8 and not t.is_contiguous:
            data = _strided_image(t, data)  # typed values of a strided tensor go in element order
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)  # flat: memoryview cannot cast an empty shape
    view = _as_bytes(data, what)
    if size is None:
        size = view.nbytes
        if offset == 0 and size != t.nbytes:
            raise OutOfBoundsError(f"{what}: data has {size} bytes but tensor {t.name!r} has {t.nbytes}; "
                                   f"pass offset/size to write part of it")
    elif size > view.nbytes:
        raise OutOfBoundsError(f"{what}: size {size} is larger than the {view.nbytes} bytes of data "
                               f"for tensor {t.name!r}")
    return view[:size], size


def _strided_image(t: Tensor, values: np.ndarray) -> np.ndarray:
    """The bytes t spans with `values` written element by element (gaps keep their current bytes)."""
    if values.size != t.nelements:
        raise OutOfBoundsError(f"tensor_set: {values.size} values for tensor {t.name!r} of {t.nelements} elements")
    raw = np.empty(t.nbytes, np.uint8)
    tensor_buffer(t).get_tensor(t, memoryview(raw), 0, t.nbytes)
    image = _typed(t, raw)
    image[...] = values.reshape(image.shape)
    return raw


# ----------------------------------------------------------------------------------------------
# Synchronous access
# ----------------------------------------------------------------------------------------------
def tensor_set(t: Tensor, data, offset: int = 0, size: int | None = None) -> None:
    """Write data into t at byte `offset` (ggml_backend_tensor_set).

    `size` defaults to all of data; a whole-tensor write (offset 0, no size) must bring exactly
    t.nbytes bytes. A typed array written whole into a strided view lands element by element.
    """
    buf = _bound_buffer(t, "tensor_set")
    if size == 0:
        return
    _check_range(t, "tensor_set", offset, 0 if size is None else size)
    view, size = _source(t, data, offset, size, "tensor_set")
    _check_range(t, "tensor_set", offset, size)
    if size:
        buf.set_tensor(t, view, offset, size)


def tensor_get(t: Tensor, offset: int = 0, size: int | None = None, out=None):
    """Read t (ggml_backend_tensor_get): all of it as a typed ndarray, or `size` raw bytes at `offset`.

    With `out`, the bytes land there (an ndarray of t's dtype and shape, or any writable buffer)
    and `out` is returned.
    """
    buf = _bound_buffer(t, "tensor_get")
    full = offset == 0 and size is None
    size = t.nbytes - offset if size is None else size
    if size == 0:
        return out if out is not None else (_typed(t, None) if full else np.empty(0, np.uint8))
    _check_range(t, "tensor_get", offset, size)
    if out is None:
        raw = np.empty(size, np.uint8)
        buf.get_tensor(t, memoryview(raw), offset, size)
        return _typed(t, raw) if full else raw
    if full and isinstance(out, np.ndarray) and out.dtype != np.uint8 and not t.is_contiguous:
        _check_dtype(t, out, "tensor_get")
        out[...] = tensor_get(t)
        return out
    buf.get_tensor(t, _destination(t, out, size, "tensor_get"), offset, size)
    return out


def _destination(t: Tensor, out, size: int, what: str) -> memoryview:
    if isinstance(out, np.ndarray):
        _check_dtype(t, out, what)
        if not out.flags.c_contiguous:
            raise LayoutError(f"{what}: output array for tensor {t.name!r} must be C-contiguous")
    view = _as_bytes(out, what, writable=True)
    if view.nbytes != size:
        raise OutOfBoundsError(f"{what}: output has {view.nbytes} bytes, reading {size} bytes of tensor {t.name!r}")
    return view


def tensor_memset(t: Tensor, value: int, offset: int = 0, size: int | None = None) -> None:
    """Fill `size` bytes of t (all of it by default) with one byte value."""
    size = t.nbytes - offset if size is None else size
    if size == 0:
        return
    buf = _bound_buffer(t, "tensor_memset")
    _check_range(t, "tensor_memset", offset, size)
    if not 0 <= value <= 255:
        raise OutOfBoundsError(f"tensor_memset: value {value} for tensor {t.name!r} is not a byte (0..255)")
    buf.memset_tensor(t, value, offset, size)


def _check_2d(t: Tensor, what: str, offset: int, size: int, n_copies: int, stride_tensor: int) -> None:
    """All n_copies rows must fit before the first one is written."""
    if n_copies < 0 or stride_tensor < 0:
        raise OutOfBoundsError(f"{what}: tensor {t.name!r}: n_copies {n_copies} and stride {stride_tensor} "
                               f"must be >= 0")
    if n_copies and size:
        _check_range(t, what, offset, (n_copies - 1) * stride_tensor + size)


def tensor_set_2d(t: Tensor, data, offset: int, size: int, n_copies: int, stride_tensor: int,
                  stride_data: int) -> None:
    """Write n_copies rows of `size` bytes: row i comes from data[i*stride_data:] and goes to
    offset + i*stride_tensor."""
    buf = _bound_buffer(t, "tensor_set_2d")
    _check_2d(t, "tensor_set_2d", offset, size, n_copies, stride_tensor)
    if not (n_copies and size):
        return
    view = _as_bytes(np.ascontiguousarray(data) if isinstance(data, np.ndarray) else data, "tensor_set_2d")
    needed = (n_copies - 1) * stride_data + size
    if view.nbytes < needed:
        raise OutOfBoundsError(f"tensor_set_2d: data has {view.nbytes} bytes, {n_copies} rows of {size} with "
                               f"stride {stride_data} need {needed} (tensor {t.name!r})")
    buf.set_tensor_2d(t, view, offset, size, n_copies, stride_tensor, stride_data)


def tensor_get_2d(t: Tensor, offset: int, size: int, n_copies: int, stride_tensor: int, stride_data: int,
                  out=None):
    """Read n_copies rows of `size` bytes into out[i*stride_data:] (a new uint8 array by default)."""
    buf = _bound_buffer(t, "tensor_get_2d")
    _check_2d(t, "tensor_get_2d", offset, size, n_copies, stride_tensor)
    needed = max(0, (n_copies - 1) * stride_data + size) if n_copies else 0
    if out is None:
        out = np.zeros(needed, np.uint8)
    view = _as_bytes(out, "tensor_get_2d", writable=True)
    if view.nbytes < needed:
        raise OutOfBoundsError(f"tensor_get_2d: output has {view.nbytes} bytes, {needed} needed (tensor {t.name!r})")
    if n_copies and size:
        buf.get_tensor_2d(t, view, offset, size, n_copies, stride_tensor, stride_data)
    return out


# ----------------------------------------------------------------------------------------------
# Asynchronous access (per backend; without async support the backend synchronizes and blocks)
# ----------------------------------------------------------------------------------------------
def tensor_set_async(backend: Backend, t: Tensor, data, offset: int = 0, size: int | None = None) -> None:
    """Queue a write on `backend`; `data` must stay unchanged until backend.synchronize()."""
    backend.check_alive()
    _bound_buffer(t, "tensor_set_async")
    view, size = _source(t, data, offset, size, "tensor_set_async")
    _check_range(t, "tensor_set_async", offset, size)
    if size:
        backend.set_tensor_async(t, view, offset, size)


def tensor_get_async(backend: Backend, t: Tensor, offset: int = 0, size: int | None = None, out=None):
    """Queue a read on `backend`; the returned array (or `out`) holds the bytes after backend.synchronize()."""
    backend.check_alive()
    _bound_buffer(t, "tensor_get_async")
    full = offset == 0 and size is None
    size = t.nbytes - offset if size is None else size
    _check_range(t, "tensor_get_async", offset, size)
    if out is None:
        raw = np.empty(size, np.uint8)
        result, dest = (_typed(t, raw) if full else raw), memoryview(raw)
    else:
        result, dest = out, _destination(t, out, size, "tensor_get_async")
    if size:
        backend.get_tensor_async(t, dest, offset, size)
    return result


# ----------------------------------------------------------------------------------------------
# Copies
# ----------------------------------------------------------------------------------------------
def _check_copy(src: Tensor, dst: Tensor, what: str) -> None:
    if not src.same_layout(dst):
        raise LayoutError(f"{what}: cannot copy tensors with different layouts: {src.name!r} is "
                          f"{T.type_name(src.type)} ne={src.ne} nb={src.nb}, {dst.name!r} is "
                          f"{T.type_name(dst.type)} ne={dst.ne} nb={dst.nb}")
    for t in (src, dst):
        if t.data is None:
            raise NotAllocatedError(f"{what}: tensor {t.name!r} is not allocated")


def host_bytes(t: Tensor) -> memoryview | None:
    """The bytes t spans, in place, when its memory is host memory (a host buffer or a context's arena)."""
    owner = t.memory_owner()
    if owner is None or not owner.is_host:
        return None
    if isinstance(owner, Buffer):
        owner.check_alive()
    offset = t.data - owner.base
    return memoryview(owner.host_array[offset: offset + t.nbytes])


def tensor_copy(src: Tensor, dst: Tensor) -> None:
    """Copy all of src into dst (same layout), through the fastest path the two buffers allow."""
    _check_copy(src, dst, "tensor_copy")
    if src is dst or src.nbytes == 0:
        return
    dst_buf = _bound_buffer(dst, "tensor_copy")
    dst_buf.check_writable("tensor_copy", dst)
    src_bytes = host_bytes(src)
    if src_bytes is not None:
        tensor_set(dst, src_bytes)
        return
    dst_bytes = host_bytes(dst)
    if dst_bytes is not None:
        tensor_get(src, out=dst_bytes)
    elif not dst_buf.cpy_tensor(src, dst):
        tensor_set(dst, tensor_get(src, 0, src.nbytes))  # staged through host memory


def tensor_copy_async(backend_src: Backend, backend_dst: Backend, src: Tensor, dst: Tensor) -> None:
    """Queue a copy on backend_dst; without async support, synchronize both and copy now."""
    _check_copy(src, dst, "tensor_copy_async")
    if src is dst:
        return
    backend_dst.check_alive()
    if backend_dst.cpy_tensor_async(backend_src, backend_dst, src, dst):
        return
    backend_src.synchronize()
    backend_dst.synchronize()
    tensor_copy(src, dst)
