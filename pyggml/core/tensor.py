"""Tensor: ggml's `struct ggml_tensor`, field for field.

ne/nb are in ggml order (ne[0] is the innermost, contiguous dimension).
`data` is an integer address (base of the buffer + offset) as in ggml, so the
allocators' address arithmetic is ggml's; the memory behind it is reached
through `memory_owner()`, which keeps host views safe (never a raw pointer).
"""

from __future__ import annotations

import struct
from enum import IntEnum, IntFlag

import numpy as np

from pyggml.core import types as T
from pyggml.errors import GGMLError, NotAllocatedError, ShapeError

MAX_DIMS = 4
MAX_SRC = 10
MAX_OP_PARAMS = 16  # int32 words (GGML_MAX_OP_PARAMS = 64 bytes)
MAX_NAME = 64
MAX_SHARED_VIEWS = 4096  # views an owner keeps by layout (a step graph has about a thousand)

Op = IntEnum(
    "Op",
    "NONE DUP ADD ADD_ID ADD1 ACC SUB MUL DIV SQR SQRT LOG SIN COS SUM SUM_ROWS CUMSUM MEAN ARGMAX COUNT_EQUAL "
    "REPEAT REPEAT_BACK CONCAT SILU_BACK NORM RMS_NORM RMS_NORM_BACK GROUP_NORM L2_NORM MUL_MAT MUL_MAT_ID OUT_PROD "
    "SCALE SET CPY CONT RESHAPE VIEW PERMUTE TRANSPOSE GET_ROWS GET_ROWS_BACK SET_ROWS DIAG DIAG_MASK_INF "
    "DIAG_MASK_ZERO SOFT_MAX SOFT_MAX_BACK ROPE ROPE_BACK CLAMP CONV_TRANSPOSE_1D IM2COL IM2COL_BACK IM2COL_3D "
    "COL2IM_1D CONV_2D CONV_3D CONV_2D_DW CONV_TRANSPOSE_2D POOL_1D POOL_2D POOL_2D_BACK UPSCALE PAD PAD_REFLECT_1D "
    "ROLL ARANGE TIMESTEP_EMBEDDING ARGSORT TOP_K LEAKY_RELU TRI FILL FLASH_ATTN_EXT FLASH_ATTN_BACK SSM_CONV "
    "SSM_SCAN WIN_PART WIN_UNPART GET_REL_POS ADD_REL_POS RWKV_WKV6 GATED_LINEAR_ATTN RWKV_WKV7 SOLVE_TRI "
    "GATED_DELTA_NET UNARY MAP_CUSTOM1 MAP_CUSTOM2 MAP_CUSTOM3 CUSTOM CROSS_ENTROPY_LOSS CROSS_ENTROPY_LOSS_BACK "
    "OPT_STEP_ADAMW OPT_STEP_SGD GLU LSTM",
    start=0,
)
Op.__doc__ = ("ggml_op with ggml 0.15.3's numbering (the RPC wire format depends on it), then pyggml's own ops, which "
              "no ggml build knows and RPC does not serve: LSTM (Silero VAD's recurrence, see ops.lstm).")

UnaryOp = IntEnum(
    "UnaryOp",
    "ABS SGN NEG STEP TANH ELU RELU SIGMOID GELU GELU_QUICK SILU HARDSWISH HARDSIGMOID EXP EXPM1 SOFTPLUS GELU_ERF "
    "XIELU FLOOR CEIL ROUND TRUNC",
    start=0,
)
GluOp = IntEnum("GluOp", "REGLU GEGLU SWIGLU SWIGLU_OAI GEGLU_ERF GEGLU_QUICK", start=0)

VIEW_OPS = frozenset({Op.VIEW, Op.RESHAPE, Op.PERMUTE, Op.TRANSPOSE})


class TensorFlag(IntFlag):
    INPUT = 1
    OUTPUT = 2
    PARAM = 4
    LOSS = 8
    COMPUTE = 16


def contiguous_strides(type_, ne) -> list[int]:
    """ggml's nb for a freshly created tensor: nb[0] = type size, nb[1] = one row, then products."""
    blck, size = T.block_traits(type_)
    if ne[0] % blck:
        T.row_size(type_, ne[0])  # raises the error that names the type and its block size
    nb1 = size * (ne[0] // blck)
    nb2 = nb1 * ne[1]
    return [size, nb1, nb2, nb2 * ne[2]]


_NO_FLAGS = TensorFlag(0)


class Tensor:
    """One ggml tensor. Created by a Context or an op; never shares ne/nb lists with another tensor."""

    __slots__ = (
        "type", "ne", "nb", "op", "op_params", "src", "flags", "view_src", "view_offs",
        "buffer", "data", "name", "extra", "_arena", "_host_view", "__weakref__",
    )

    def __init__(self, type_, ne, nb=None, *, op=Op.NONE, view_src: Tensor | None = None, view_offs: int = 0,
                 name: str = ""):
        type_ = T.as_type(type_)
        ne = [int(n) for n in ne]
        if len(ne) < MAX_DIMS:
            ne += [1] * (MAX_DIMS - len(ne))
        if len(ne) != MAX_DIMS or min(ne) < 0:
            raise ShapeError(f"tensor {name!r}: ne must be up to {MAX_DIMS} non-negative ints, got {ne}")
        blck = T.block_traits(type_)[0]
        if ne[0] % blck:
            raise ShapeError(
                f"tensor {name!r}: ne[0]={ne[0]} is not a multiple of the {type_.name} block size {blck}"
            )
        if view_src is not None and view_src.view_src is not None:  # views of views collapse to the root
            view_offs += view_src.view_offs
            view_src = view_src.view_src
        self.type = type_
        self.ne = ne
        self.nb = list(nb) if nb is not None else contiguous_strides(type_, ne)
        self.op = op if type(op) is Op else Op(op)  # Op(member) costs an enum lookup per tensor
        self.op_params = [0] * MAX_OP_PARAMS
        self.src: list[Tensor | None] = [None] * MAX_SRC
        self.flags = _NO_FLAGS
        self.view_src = view_src
        self.view_offs = int(view_offs)
        self.buffer = None
        self.data: int | None = None
        self.name = ""
        self.extra = None
        self._arena = None
        self._host_view: tuple | None = None  # (key, ndarray): host_ndarray's last answer
        self.set_name(name)
        if view_src is not None:
            if self.nbytes and self.view_offs + self.nbytes > view_src.nbytes:
                raise ShapeError(
                    f"view {name!r} of {view_src.name!r}: offset {self.view_offs} + {self.nbytes} bytes "
                    f"exceeds the {view_src.nbytes} bytes of its source"
                )
            if view_src.data is not None:
                self.data = view_src.data + self.view_offs
            self._arena = view_src._arena

    # ----- sizes and layout -------------------------------------------------------------------
    @property
    def nelements(self) -> int:
        return self.ne[0] * self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nrows(self) -> int:
        return self.ne[1] * self.ne[2] * self.ne[3]

    @property
    def nbytes(self) -> int:
        """ggml_nbytes: the span from the first to the last byte, strides included."""
        ne, nb = self.ne, self.nb  # unrolled: the allocators ask for this once per planned tensor
        if ne[0] <= 0 or ne[1] <= 0 or ne[2] <= 0 or ne[3] <= 0:
            return 0
        rows = (ne[1] - 1) * nb[1] + (ne[2] - 1) * nb[2] + (ne[3] - 1) * nb[3]
        blck, size = T.block_traits(self.type)
        if blck == 1:
            return size + (ne[0] - 1) * nb[0] + rows
        return ne[0] * nb[0] // blck + rows

    @property
    def n_dims(self) -> int:
        for i in range(MAX_DIMS - 1, 0, -1):
            if self.ne[i] > 1:
                return i + 1
        return 1

    @property
    def numpy_ndim(self) -> int:
        """Dims of `numpy()`: n_dims, except that a dim of 0 elements is kept (ggml_n_dims counts dims > 1 only)."""
        return max((i + 1 for i, n in enumerate(self.ne) if n != 1), default=1)

    def _contiguous_from(self, n: int) -> bool:
        """ggml_is_contiguous_n: dims above n are packed; dims 1..n may have any stride."""
        next_nb = T.type_size(self.type)
        if self.ne[0] != T.blck_size(self.type) and self.nb[0] != next_nb:
            return False
        next_nb *= self.ne[0] // T.blck_size(self.type)
        for i in range(1, MAX_DIMS):
            if i > n:
                if self.ne[i] != 1 and self.nb[i] != next_nb:
                    return False
                next_nb *= self.ne[i]
            else:
                next_nb = self.ne[i] * self.nb[i]
        return True

    @property
    def is_contiguous(self) -> bool:
        return self._contiguous_from(0)

    def is_contiguous_n(self, n: int) -> bool:
        return self._contiguous_from(n)

    @property
    def is_contiguous_rows(self) -> bool:
        return self.ne[0] == T.blck_size(self.type) or self.nb[0] == T.type_size(self.type)

    @property
    def is_transposed(self) -> bool:
        return self.nb[0] > self.nb[1]

    @property
    def is_permuted(self) -> bool:
        return self.nb[0] > self.nb[1] or self.nb[1] > self.nb[2] or self.nb[2] > self.nb[3]

    @property
    def is_empty(self) -> bool:
        return any(n == 0 for n in self.ne)

    @property
    def is_view(self) -> bool:
        return self.view_src is not None

    def same_shape(self, other: Tensor) -> bool:
        return self.ne == other.ne

    def same_layout(self, other: Tensor) -> bool:
        """ggml_are_same_layout: type, ne and nb all equal."""
        return self.type == other.type and self.ne == other.ne and self.nb == other.nb

    def can_repeat(self, to: Tensor) -> bool:
        """ggml_can_repeat: every dim of self divides the matching dim of `to` (empty tensors repeat to empty)."""
        if self.is_empty:
            return to.is_empty
        return all(to.ne[i] % self.ne[i] == 0 for i in range(MAX_DIMS))

    # ----- flags ------------------------------------------------------------------------------
    def set_input(self) -> Tensor:
        self.flags |= TensorFlag.INPUT
        return self

    def set_output(self) -> Tensor:
        """Flag OUTPUT on the tensor and on the root it views, so that the allocator never frees
        the memory an output view reads (ggml HEAD behaviour; 0.15.3 flags only the view)."""
        self.flags |= TensorFlag.OUTPUT
        if self.view_src is not None:
            self.view_src.flags |= TensorFlag.OUTPUT
        return self

    def set_param(self) -> Tensor:
        self.flags |= TensorFlag.PARAM
        return self

    def set_loss(self) -> Tensor:
        self.flags |= TensorFlag.LOSS
        return self

    @property
    def is_input(self) -> bool:
        return bool(self.flags & TensorFlag.INPUT)

    @property
    def is_output(self) -> bool:
        return bool(self.flags & TensorFlag.OUTPUT)

    def set_name(self, name: str) -> Tensor:
        """ggml keeps at most 63 bytes of a name; longer names are cut the same way."""
        name = str(name)
        if len(name) < MAX_NAME and name.isascii():  # the common case: already within ggml's limit
            self.name = name
        else:
            self.name = name.encode("utf-8")[: MAX_NAME - 1].decode("utf-8", errors="ignore")
        return self

    def format_name(self, fmt: str, *args) -> Tensor:
        return self.set_name(fmt % args if args else fmt)

    # ----- op params (raw int32 words, floats bit-cast like ggml) -------------------------------
    def set_op_params_i32(self, i: int, value: int) -> None:
        self.op_params[i] = (int(value) + 2**31) % 2**32 - 2**31  # wrap like a C int32

    def set_op_params_f32(self, i: int, value: float) -> None:
        self.op_params[i] = struct.unpack("<i", struct.pack("<f", float(value)))[0]

    def op_params_i32(self, i: int) -> int:
        return self.op_params[i]

    def op_params_f32(self, i: int) -> float:
        return struct.unpack("<f", struct.pack("<i", self.op_params[i]))[0]

    def set_op_params(self, words) -> None:
        """Set the leading words from ints (kept) and floats (bit-cast), e.g. [eps] or [n_dims, mode]."""
        for i, w in enumerate(words):
            (self.set_op_params_f32 if isinstance(w, float) else self.set_op_params_i32)(i, w)

    @property
    def unary_op(self) -> UnaryOp:
        return UnaryOp(self.op_params[0])

    @property
    def glu_op(self) -> GluOp:
        return GluOp(self.op_params[0])

    @property
    def srcs(self) -> list[Tensor]:
        """The non-empty source slots, in slot order."""
        return [s for s in self.src if s is not None]

    # ----- memory -----------------------------------------------------------------------------
    def memory_owner(self):
        """The object holding this tensor's bytes: its buffer (or its root's), else a context arena."""
        buf = self.buffer if self.buffer is not None else (self.view_src.buffer if self.view_src is not None else None)
        return buf if buf is not None else self._arena

    def numpy(self) -> np.ndarray:
        """A zero-copy NumPy view of a host tensor, shaped ne[:n_dims] reversed (block types: raw uint8 rows).

        Leading size-1 dims are dropped for convenience; `host_ndarray` gives the full 4-D view.
        """
        v = host_ndarray(self)
        return v.reshape(v.shape[MAX_DIMS - self.numpy_ndim:])

    def __repr__(self) -> str:
        if not hasattr(self, "_arena"):  # __init__ refused its arguments before finishing
            return "Tensor(<not constructed>)"
        dims = "x".join(str(n) for n in self.ne[: self.n_dims])
        parts = [f"{self.name or '<unnamed>'!r}", T.type_name(self.type), f"[{dims}]"]
        if self.op != Op.NONE:
            parts.append(self.op.name + (f"({self.unary_op.name})" if self.op == Op.UNARY else ""))
        if self.view_src is not None:
            parts.append(f"view of {self.view_src.name!r}+{self.view_offs}")
        if self.flags:
            parts.append("|".join(f.name for f in TensorFlag if self.flags & f))
        if self.data is not None:
            parts.append(f"@0x{self.data:x}")
        return f"Tensor({', '.join(parts)})"


def host_ndarray(t: Tensor) -> np.ndarray:
    """A strided NumPy view of a tensor that lives in host memory, without copying.

    The owner (a host buffer or a context arena) exposes `host_array` (uint8) and `base`
    (the address of host_array[0]); the tensor's address minus base is its byte offset.
    Plain types come back with shape ne[::-1] and strides nb[::-1]; block types as uint8
    rows of shape (ne3, ne2, ne1, row_bytes).
    """
    owner = t.memory_owner()
    if t.data is None or owner is None:
        raise NotAllocatedError(f"tensor {t.name!r} has no memory (data={t.data}, buffer={t.buffer})")
    host = getattr(owner, "host_array", None)
    if host is None:
        raise GGMLError(f"tensor {t.name!r} lives in {owner!r}, which is not host memory")
    # The view is cached while address, memory and layout stay the same; the cached view keeps `host`
    # alive, so id(host) cannot be reused by other memory meanwhile. An owner that offers `host_views`
    # (a dict) also keeps views by layout, so that the tensors of a graph rebuilt every step with the
    # same plan (a model's next token) find their views already made.
    key = (t.data, id(host), t.type, *t.ne, *t.nb)
    cached = t._host_view
    if cached is not None and cached[0] == key:
        return cached[1]
    shared = getattr(owner, "host_views", None)
    view = shared.get(key) if shared is not None else None
    if view is None:
        view = _new_host_view(t, owner, host)
        if shared is not None:
            if len(shared) >= MAX_SHARED_VIEWS:
                shared.clear()
            shared[key] = view
    t._host_view = (key, view)
    return view


def _new_host_view(t: Tensor, owner, host: np.ndarray) -> np.ndarray:
    offset = t.data - owner.base
    nbytes = t.nbytes
    if offset < 0 or offset + nbytes > host.nbytes:
        raise NotAllocatedError(
            f"tensor {t.name!r} at offset {offset} with {nbytes} bytes lies outside its {host.nbytes}-byte memory"
        )
    if T.is_quantized(t.type):
        shape = (t.ne[3], t.ne[2], t.ne[1], T.row_size(t.type, t.ne[0]))
        strides = (t.nb[3], t.nb[2], t.nb[1], 1)
        dtype = np.dtype(np.uint8)
    else:
        shape = tuple(reversed(t.ne))
        strides = tuple(reversed(t.nb))
        dtype = T.numpy_dtype(t.type)
    return np.ndarray(shape, dtype=dtype, buffer=host, offset=offset, strides=strides)
