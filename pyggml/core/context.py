"""Context: creates tensors (ggml_context), optionally with host memory of their own."""

from __future__ import annotations

import numpy as np

from pyggml.core import types as T
from pyggml.core.host_memory import HostArena
from pyggml.core.tensor import MAX_DIMS, Tensor
from pyggml.errors import GGMLError, ShapeError


class Context:
    """Holds tensors in creation order (the order `alloc_ctx_tensors` packs them in).

    With no_alloc=False every new non-view tensor gets zeroed host memory at once, so
    a short script can compute without buffers; with no_alloc=True (the usual case with
    backends) tensors are metadata until an allocator places them.
    """

    def __init__(self, no_alloc: bool = False, max_tensors: int | None = None):
        self.no_alloc = no_alloc
        self.max_tensors = max_tensors
        self.tensors: list[Tensor] = []

    def __iter__(self):
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def __repr__(self) -> str:
        return f"Context({len(self.tensors)} tensors, no_alloc={self.no_alloc})"

    def add(self, t: Tensor) -> Tensor:
        """Adopt a tensor built elsewhere (ops build through this), giving it memory if the context allocates."""
        if self.max_tensors is not None and len(self.tensors) >= self.max_tensors:
            raise GGMLError(f"context is full: it holds at most {self.max_tensors} tensors")
        if not self.no_alloc and t.view_src is None and t.data is None:
            arena = HostArena(t.nbytes)
            t._arena = arena
            t.data = arena.base
        self.tensors.append(t)
        return t

    def new_tensor(self, type_, ne, name: str = "") -> Tensor:
        ne = tuple(ne)
        if not 1 <= len(ne) <= MAX_DIMS:
            raise ShapeError(f"new_tensor {name!r}: between 1 and {MAX_DIMS} dims expected, got {len(ne)}")
        return self.add(Tensor(type_, ne, name=name))

    def new_tensor_1d(self, type_, ne0: int, name: str = "") -> Tensor:
        return self.new_tensor(type_, (ne0,), name)

    def new_tensor_2d(self, type_, ne0: int, ne1: int, name: str = "") -> Tensor:
        return self.new_tensor(type_, (ne0, ne1), name)

    def new_tensor_3d(self, type_, ne0: int, ne1: int, ne2: int, name: str = "") -> Tensor:
        return self.new_tensor(type_, (ne0, ne1, ne2), name)

    def new_tensor_4d(self, type_, ne0: int, ne1: int, ne2: int, ne3: int, name: str = "") -> Tensor:
        return self.new_tensor(type_, (ne0, ne1, ne2, ne3), name)

    def dup_tensor(self, t: Tensor, name: str = "") -> Tensor:
        """A new tensor with t's type and ne (contiguous, no data): ggml_dup_tensor."""
        return self.new_tensor(t.type, t.ne, name)

    def view_tensor(self, t: Tensor, name: str | None = None) -> Tensor:
        """A view of all of t with its strides and op NONE: ggml_view_tensor."""
        v = Tensor(t.type, t.ne, t.nb, view_src=t, view_offs=0, name=f"{t.name} (view)" if name is None else name)
        return self.add(v)

    def get_tensor(self, name: str) -> Tensor | None:
        return next((t for t in self.tensors if t.name == name), None)

    def tensor_from_numpy(self, arr, type_=None, name: str = "") -> Tensor:
        """A tensor shaped like arr (ggml order: ne = reversed shape) holding arr's values.

        In an allocating context the values are copied in at once; in a no_alloc context
        use `backend.tensor_set` after allocation.
        """
        arr = np.asarray(arr)
        if arr.ndim == 0 or arr.ndim > MAX_DIMS:
            raise ShapeError(f"tensor_from_numpy {name!r}: 1 to {MAX_DIMS} dims expected, got shape {arr.shape}")
        type_ = T.as_type(type_ if type_ is not None else _type_of(arr.dtype))
        ne = tuple(reversed(arr.shape))
        t = self.new_tensor(type_, ne, name)
        if not self.no_alloc:
            dst = t.numpy()
            dst[...] = T.encode(type_, arr).reshape(dst.shape)
        return t


def _type_of(dtype: np.dtype) -> T.GGMLType:
    mapping = {"float32": "F32", "float16": "F16", "float64": "F64", "int8": "I8", "int16": "I16",
               "int32": "I32", "int64": "I64"}
    try:
        return T.as_type(mapping[np.dtype(dtype).name])
    except KeyError:
        raise T.UnsupportedTypeError(f"no ggml type for NumPy dtype {dtype}; pass type_ explicitly") from None
