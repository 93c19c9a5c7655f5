"""Moving and reinterpreting data: copies (cpy, cast, cont), views (reshape, view, permute, transpose),
repeats, concat, pad, row gather/scatter (get_rows, set_rows) and diag.

View results alias their source's memory and carry ggml's names ("x (view)", "x (reshaped)", ...);
view_* keep their byte offset in op_params words 0..1 (a little-endian size_t), permute its axes in 0..3.
"""

from __future__ import annotations

import math
import struct

from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result, new_view
from pyggml.core.tensor import MAX_DIMS, Op, Tensor, contiguous_strides

__all__ = [
    "cpy", "cast", "cont", "cont_1d", "cont_2d", "cont_3d", "cont_4d",
    "reshape", "reshape_1d", "reshape_2d", "reshape_3d", "reshape_4d",
    "view_1d", "view_2d", "view_3d", "view_4d", "permute", "transpose",
    "repeat", "repeat_4d", "repeat_back", "concat", "pad", "pad_ext", "pad_circular", "pad_ext_circular",
    "get_rows", "set_rows", "diag",
    "set", "set_inplace", "set_1d", "set_1d_inplace", "set_2d", "set_2d_inplace",
    "acc", "acc_inplace",
]


# ----- copies ----------------------------------------------------------------------------------
def cpy(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Copy a's elements (in row-major order) into b, converting to b's type; the result is a view of b."""
    check_shape(a.nelements == b.nelements, "cpy", "a and b must have the same number of elements", a, b)
    name = f"{b.name} (copy of {a.name})" if b.name else f"{a.name} (copy)"
    t = ctx.view_tensor(b, name=name)
    t.op = Op.CPY
    t.src[0], t.src[1] = a, b
    return t


def cast(ctx: Context, a: Tensor, type_) -> Tensor:
    """a converted to a new tensor of `type_`; src[1] is the result itself, as in ggml."""
    t = new_result(ctx, Op.CPY, T.as_type(type_), a.ne, (a,))
    t.set_name(f"{a.name} (copy)")
    t.src[1] = t
    return t


def cont(ctx: Context, a: Tensor) -> Tensor:
    """A contiguous copy of a (typically of a permuted or strided view)."""
    return cont_4d(ctx, a, *a.ne)


def cont_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return cont_4d(ctx, a, ne0, 1, 1, 1)


def cont_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, 1, 1)


def cont_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return cont_4d(ctx, a, ne0, ne1, ne2, 1)


def cont_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    """A contiguous copy of a with a new shape of the same element count."""
    ne = [ne0, ne1, ne2, ne3]
    check_shape(a.nelements == math.prod(ne), "cont", f"cannot hold its {a.nelements} elements in ne={ne}", a)
    t = new_result(ctx, Op.CONT, a.type, ne, (a,))
    t.set_name(f"{a.name} (cont)")
    return t


# ----- views -----------------------------------------------------------------------------------
def _reshape(ctx: Context, a: Tensor, ne) -> Tensor:
    check_shape(a.is_contiguous, "reshape", "a must be contiguous", a)
    check_shape(a.nelements == math.prod(ne), "reshape", f"cannot view its {a.nelements} elements as ne={list(ne)}", a)
    full = [*ne] + [1] * (MAX_DIMS - len(ne))
    return new_view(ctx, a, Op.RESHAPE, full, contiguous_strides(a.type, full), 0, "reshaped")


def reshape(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a viewed with b's shape (b's layout does not matter)."""
    return _reshape(ctx, a, b.ne)


def reshape_1d(ctx: Context, a: Tensor, ne0: int) -> Tensor:
    return _reshape(ctx, a, (ne0,))


def reshape_2d(ctx: Context, a: Tensor, ne0: int, ne1: int) -> Tensor:
    return _reshape(ctx, a, (ne0, ne1))


def reshape_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int) -> Tensor:
    return _reshape(ctx, a, (ne0, ne1, ne2))


def reshape_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    return _reshape(ctx, a, (ne0, ne1, ne2, ne3))


def _view(ctx: Context, a: Tensor, ne, strides, offset: int) -> Tensor:
    """ggml_view_impl: ne[0] elements packed, then the given row/plane strides; offset in bytes."""
    check_shape(offset >= 0, "view", f"negative offset {offset}", a)
    full = [*ne] + [1] * (MAX_DIMS - len(ne))
    nb = contiguous_strides(a.type, full)
    nb[1: 1 + len(strides)] = strides
    for i in range(1 + len(strides), MAX_DIMS):
        nb[i] = nb[i - 1] * full[i - 1]
    t = new_view(ctx, a, Op.VIEW, full, nb, offset, "view")
    t.set_op_params(struct.unpack("<2i", struct.pack("<Q", offset)))
    return t


def view_1d(ctx: Context, a: Tensor, ne0: int, offset: int) -> Tensor:
    return _view(ctx, a, (ne0,), (), offset)


def view_2d(ctx: Context, a: Tensor, ne0: int, ne1: int, nb1: int, offset: int) -> Tensor:
    return _view(ctx, a, (ne0, ne1), (nb1,), offset)


def view_3d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, nb1: int, nb2: int, offset: int) -> Tensor:
    return _view(ctx, a, (ne0, ne1, ne2), (nb1, nb2), offset)


def view_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int, nb1: int, nb2: int, nb3: int,
            offset: int) -> Tensor:
    return _view(ctx, a, (ne0, ne1, ne2, ne3), (nb1, nb2, nb3), offset)


def permute(ctx: Context, a: Tensor, axis0: int, axis1: int, axis2: int, axis3: int) -> Tensor:
    """Dim i of a becomes dim axis_i of the result (ggml's convention, the inverse of NumPy's transpose)."""
    axes = [axis0, axis1, axis2, axis3]
    check_shape(sorted(axes) == [0, 1, 2, 3], "permute", f"axes {axes} must be a permutation of 0..3", a)
    ne, nb = [0] * MAX_DIMS, [0] * MAX_DIMS
    for i, ax in enumerate(axes):
        ne[ax], nb[ax] = a.ne[i], a.nb[i]
    t = new_view(ctx, a, Op.PERMUTE, ne, nb, 0, "permuted")
    t.set_op_params(axes)
    return t


def transpose(ctx: Context, a: Tensor) -> Tensor:
    """Swap dims 0 and 1."""
    ne = [a.ne[1], a.ne[0], a.ne[2], a.ne[3]]
    nb = [a.nb[1], a.nb[0], a.nb[2], a.nb[3]]
    return new_view(ctx, a, Op.TRANSPOSE, ne, nb, 0, "transposed")


# ----- repeats, concat, pad --------------------------------------------------------------------
def repeat(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a tiled to b's shape."""
    check_shape(a.can_repeat(b), "repeat", "every dim of a must divide the same dim of b", a, b)
    return new_result(ctx, Op.REPEAT, a.type, b.ne, (a,))


def repeat_4d(ctx: Context, a: Tensor, ne0: int, ne1: int, ne2: int, ne3: int) -> Tensor:
    ne = [ne0, ne1, ne2, ne3]
    ok = a.is_empty or all(n % m == 0 for n, m in zip(ne, a.ne, strict=True))
    check_shape(ok, "repeat_4d", f"every dim of a must divide ne={ne}", a)
    return new_result(ctx, Op.REPEAT, a.type, ne, (a,))


def repeat_back(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """The sum of a's tiles, shaped like b (the gradient of repeat)."""
    check_shape(b.can_repeat(a), "repeat_back", "every dim of b must divide the same dim of a", a, b)
    return new_result(ctx, Op.REPEAT_BACK, a.type, b.ne, (a,))


def concat(ctx: Context, a: Tensor, b: Tensor, dim: int) -> Tensor:
    check_shape(0 <= dim < MAX_DIMS, "concat", f"dim={dim} outside 0..{MAX_DIMS - 1}", a, b)
    check_type(a.type == b.type, "concat", "a and b must have the same type", a, b)
    ok = all(a.ne[d] == b.ne[d] for d in range(MAX_DIMS) if d != dim)
    check_shape(ok, "concat", f"a and b must agree on every dim but {dim}", a, b)
    ne = list(a.ne)
    ne[dim] += b.ne[dim]
    return new_result(ctx, Op.CONCAT, a.type, ne, (a, b), (dim,))


def pad_ext(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int, lp3: int,
            rp3: int) -> Tensor:
    """Zeros added before (lp) and after (rp) each dim; op_params [lp0, rp0, ..., lp3, rp3, circular=0]."""
    pads = [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3]
    check_shape(all(p >= 0 for p in pads), "pad", f"paddings {pads} must be >= 0", a)
    ne = [a.ne[i] + pads[2 * i] + pads[2 * i + 1] for i in range(MAX_DIMS)]
    return new_result(ctx, Op.PAD, a.type, ne, (a,), (*pads, 0))


def pad(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    """Zeros added after each dim."""
    return pad_ext(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


def pad_ext_circular(ctx: Context, a: Tensor, lp0: int, rp0: int, lp1: int, rp1: int, lp2: int, rp2: int,
                     lp3: int, rp3: int) -> Tensor:
    """Like pad_ext, but the padding wraps around a's other end (op_params[8] = 1)."""
    t = pad_ext(ctx, a, lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3)
    t.set_op_params_i32(8, 1)
    return t


def pad_circular(ctx: Context, a: Tensor, p0: int, p1: int, p2: int, p3: int) -> Tensor:
    return pad_ext_circular(ctx, a, 0, p0, 0, p1, 0, p2, 0, p3)


# ----- rows ------------------------------------------------------------------------------------
def get_rows(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """Rows a[:, b[i, j, k], j, k] (dequantized to F32; I32 stays I32): embedding lookups."""
    check_shape(a.ne[2] == b.ne[1] and a.ne[3] == b.ne[2] and b.ne[3] == 1, "get_rows",
                "ids must be shaped [n, a.ne[2], a.ne[3]]", a, b)
    check_type(b.type == T.GGMLType.I32, "get_rows", "ids must be I32", b)
    type_ = T.GGMLType.I32 if a.type == T.GGMLType.I32 else T.GGMLType.F32
    return new_result(ctx, Op.GET_ROWS, type_, [a.ne[0], b.ne[0], b.ne[1], b.ne[2]], (a, b))


def set_rows(ctx: Context, a: Tensor, b: Tensor, c: Tensor) -> Tensor:
    """Write b's rows into a at rows c (converting to a's type); the result is a view of a.

    src order is (b, c, a), ggml's legacy order.
    """
    check_shape(a.ne[0] == b.ne[0] and a.ne[2] == b.ne[2] and a.ne[3] == b.ne[3], "set_rows",
                "a and b must agree on dims 0, 2 and 3", a, b)
    check_shape(b.ne[1] == c.ne[0], "set_rows", "c.ne[0] must equal b.ne[1] (one index per row of b)", b, c)
    check_shape(c.ne[1] > 0 and c.ne[2] > 0 and b.ne[2] % c.ne[1] == 0 and b.ne[3] % c.ne[2] == 0 and c.ne[3] == 1,
                "set_rows", "c's dims 1 and 2 must divide b's dims 2 and 3, and c.ne[3] must be 1", b, c)
    check_type(b.type == T.GGMLType.F32, "set_rows", "b must be F32", b)
    check_type(c.type in (T.GGMLType.I64, T.GGMLType.I32), "set_rows", "c must be I64 or I32", c)
    check_shape(a.is_contiguous_rows and b.is_contiguous_rows, "set_rows", "a and b need contiguous rows", a, b)
    t = ctx.view_tensor(a)
    t.op = Op.SET_ROWS
    t.src[0], t.src[1], t.src[2] = b, c, a
    return t


# ----- strided writes: set, acc ----------------------------------------------------------------
def _strided_write(ctx: Context, op: Op, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int,
                   inplace: bool, types: tuple) -> Tensor:
    """ggml_set_impl / ggml_acc_impl: a copy (or, inplace, a view) of a whose region seen with b's shape, the
    byte strides (element size, nb1, nb2, nb3) and the byte offset gets b written (SET) or added (ACC).
    op_params [nb1, nb2, nb3, offset, inplace]. The region must lie inside a: checked here, where ggml
    asserts only when it computes."""
    name = op.name.lower()
    check_type(a.type in types and b.type == a.type, name,
               f"a and b must have the same type, one of {', '.join(t.name for t in types)}", a, b)
    check_shape(a.is_contiguous and b.is_contiguous_rows, name, "a must be contiguous and b's rows packed", a, b)
    check_shape(min(nb1, nb2, nb3, offset) >= 0 and offset < 1 << 30, name,
                f"strides ({nb1}, {nb2}, {nb3}) and offset {offset} must be >= 0 (offset below 2^30)", a, b)
    size = T.type_size(a.type)
    check_shape(offset % size == 0 and nb1 % size == 0 and nb2 % size == 0 and nb3 % size == 0, name,
                f"strides ({nb1}, {nb2}, {nb3}) and offset {offset} must be multiples of the element size {size}",
                a, b)
    last = offset + sum((n - 1) * stride for n, stride in zip(b.ne, (size, nb1, nb2, nb3), strict=True))
    check_shape(b.nelements == 0 or last + size <= a.nbytes, name,
                f"the region written ends at byte {last + size}, past a's {a.nbytes} bytes", a, b)
    return new_result(ctx, op, a.type, a.ne, (a, b), (nb1, nb2, nb3, offset, int(inplace)),
                      inplace_of=a if inplace else None)


_SET_TYPES = (T.GGMLType.F32, T.GGMLType.I32)


def set(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:  # noqa: A001
    """ggml_set: a copy of a with b written over the region at byte `offset` with row strides nb1..nb3."""
    return _strided_write(ctx, Op.SET, a, b, nb1, nb2, nb3, offset, False, _SET_TYPES)


def set_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _strided_write(ctx, Op.SET, a, b, nb1, nb2, nb3, offset, True, _SET_TYPES)


def set_1d(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    """b's elements written into a from byte `offset` on, with a's own strides."""
    return set(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset)


def set_1d_inplace(ctx: Context, a: Tensor, b: Tensor, offset: int) -> Tensor:
    return set_inplace(ctx, a, b, a.nb[1], a.nb[2], a.nb[3], offset)


def set_2d(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    """b's rows written into a with row stride nb1 from byte `offset` on."""
    return set(ctx, a, b, nb1, a.nb[2], a.nb[3], offset)


def set_2d_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, offset: int) -> Tensor:
    return set_inplace(ctx, a, b, nb1, a.nb[2], a.nb[3], offset)


def acc(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    """ggml_acc: a copy of a with b added into the region at byte `offset` with row strides nb1..nb3 (F32)."""
    return _strided_write(ctx, Op.ACC, a, b, nb1, nb2, nb3, offset, False, (T.GGMLType.F32,))


def acc_inplace(ctx: Context, a: Tensor, b: Tensor, nb1: int, nb2: int, nb3: int, offset: int) -> Tensor:
    return _strided_write(ctx, Op.ACC, a, b, nb1, nb2, nb3, offset, True, (T.GGMLType.F32,))


def diag(ctx: Context, a: Tensor) -> Tensor:
    """A square matrix per (ne2, ne3) with a's row on the diagonal."""
    check_shape(a.ne[1] == 1, "diag", "a must be a row vector (ne[1] == 1)", a)
    return new_result(ctx, Op.DIAG, a.type, [a.ne[0], a.ne[0], a.ne[2], a.ne[3]], (a,))
