"""What the RPC server checks before it touches a client's tensor: layout, op, sources, parameters and work.

A client describes tensors by raw fields (type, ne, nb, op, op_params, sources). ggml's server
trusts them apart from a bounds check; pyggml accepts only what ggml itself could have built:

- layout: a tensor that is not a view has dense strides (ggml's contiguous ones, or a permutation
  of them as conv_2d_dw's channels-innermost result); a view may have any strides, but its extent
  lies in its buffer and its element count is at most what the buffer could hold, so zero or
  overlapping strides cannot turn a few bytes into an unbounded amount of work;
- node: the op is one the device supports, every source the op needs is there, and the node's
  shape is the one ggml's op builder gives for those sources and op_params (so pads, strides,
  dilations, groups and the like are bounded by the tensors they apply to);
- work: a graph's estimated element operations are bounded relative to the bytes of the buffers
  it touches (see `graph_work`).
"""

from __future__ import annotations

from pyggml.core import ops
from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.ops import attention, conv, reduce
from pyggml.core.tensor import GluOp, Op, Tensor, UnaryOp
from pyggml.errors import GGMLError, RPCError


class Refused(RPCError):
    """A request failed a check; the session closes the connection."""


# ----------------------------------------------------------------------------------------------
# Layout
# ----------------------------------------------------------------------------------------------
def logical_bytes(t: Tensor) -> int:
    """Bytes the tensor's elements take when packed (ggml_row_size * rows), whatever its strides."""
    blck, size = T.block_traits(t.type)
    return t.nelements // blck * size


def is_dense(t: Tensor) -> bool:
    """Strides that pack the elements with no gap or overlap, the dims in any order (conv_2d_dw_direct's
    channels-innermost result is one); blocks of a quantized type stay innermost."""
    blck, size = T.block_traits(t.type)
    if blck > 1:
        if t.nb[0] != size:
            return False
        expect, dims = size * (t.ne[0] // blck), range(1, 4)
    else:
        expect, dims = size, range(4)
    for i in sorted((i for i in dims if t.ne[i] > 1), key=lambda i: (t.nb[i], i)):
        if t.nb[i] != expect:
            return False
        expect *= t.ne[i]
    return True


def check_layout(t: Tensor, is_view: bool, buffer_size: int | None) -> None:
    """Refuse strides ggml cannot produce, and element counts beyond what the tensor's buffer could hold."""
    if 0 in t.ne:
        return
    if not is_view and not is_dense(t):
        raise Refused(f"tensor {t.name!r} {t.type.name}{t.ne} is not a view but has strides {t.nb}, which do not "
                      f"pack its elements (ggml gives a new tensor dense strides)")
    if buffer_size is not None and logical_bytes(t) > buffer_size:
        raise Refused(f"tensor {t.name!r} {t.type.name}{t.ne} with strides {t.nb} has {logical_bytes(t)} bytes of "
                      f"elements, more than its buffer of {buffer_size} bytes could hold")


# ----------------------------------------------------------------------------------------------
# Nodes: the shape ggml's builder gives for the node's sources and op_params
# ----------------------------------------------------------------------------------------------
def _i(t: Tensor, n: int) -> list[int]:
    return [t.op_params_i32(i) for i in range(n)]


def _f(t: Tensor, *idx: int) -> list[float]:
    return [t.op_params_f32(i) for i in idx]


def _s(t: Tensor, i: int) -> Tensor:
    return t.src[i]


def _conv_params(t: Tensor, image: Tensor, n_spatial: int, strides, pads, dilations) -> None:
    """Strides and dilations >= 1, pads in [0, input size]: what keeps a convolution's padded input bounded."""
    for d in range(n_spatial):
        size = image.ne[d]
        if strides[d] < 1 or dilations[d] < 1 or not 0 <= pads[d] <= size:
            raise Refused(f"{t.op.name} {t.name!r}: stride {strides[d]}, pad {pads[d]}, dilation {dilations[d]} on "
                          f"dim {d} of an input of {size}: need stride >= 1, dilation >= 1, 0 <= pad <= {size}")


def _conv_2d(ctx, t):
    s0, s1, p0, p1, d0, d1 = _i(t, 6)
    _conv_params(t, _s(t, 1), 2, (s0, s1), (p0, p1), (d0, d1))
    build = ops.conv_2d_direct if t.op == Op.CONV_2D else ops.conv_2d_dw_direct
    return build(ctx, _s(t, 0), _s(t, 1), s0, s1, p0, p1, d0, d1)


def _im2col(ctx, t):
    s0, s1, p0, p1, d0, d1, is_2d = _i(t, 7)
    _conv_params(t, _s(t, 1), 2 if is_2d else 1, (s0, s1), (p0, p1), (d0, d1))
    return ops.im2col(ctx, _s(t, 0), _s(t, 1), s0, s1, p0, p1, d0, d1, bool(is_2d), t.type)


def _pool(ctx, t):
    one_d = t.op == Op.POOL_1D
    kind, *p = _i(t, 4 if one_d else 7)
    kernel, strides, pads = (p[0:1], p[1:2], p[2:3]) if one_d else (p[0:2], p[2:4], p[4:6])
    if min(kernel) < 1 or any(k > _s(t, 0).ne[d] + 2 * max(pads[d], 0) for d, k in enumerate(kernel)):
        raise Refused(f"{t.op.name} {t.name!r}: kernel {kernel} must be >= 1 and fit the padded input {_s(t, 0).ne}")
    _conv_params(t, _s(t, 0), len(kernel), strides, pads, (1, 1))
    if one_d:
        return ops.pool_1d(ctx, _s(t, 0), conv.PoolOp(kind), *kernel, *strides, *pads)
    return ops.pool_2d(ctx, _s(t, 0), conv.PoolOp(kind), *kernel, *strides, *pads)


def _conv_transpose(ctx, t):
    if t.op == Op.CONV_TRANSPOSE_1D:
        s0, p0, d0 = _i(t, 3)
        _conv_params(t, _s(t, 1), 1, (s0,), (p0,), (d0,))
        return ops.conv_transpose_1d(ctx, _s(t, 0), _s(t, 1), s0, p0, d0)
    stride = t.op_params_i32(0)
    _conv_params(t, _s(t, 1), 2, (stride, stride), (0, 0), (1, 1))
    return ops.conv_transpose_2d_p0(ctx, _s(t, 0), _s(t, 1), stride)


def _group_norm(ctx, t):
    groups = t.op_params_i32(0)
    if not 1 <= groups <= max(t.ne[2], 1):
        raise Refused(f"GROUP_NORM {t.name!r}: {groups} groups for {t.ne[2]} channels (need 1 <= groups <= channels)")
    return ops.group_norm(ctx, _s(t, 0), groups, *_f(t, 1))


def _rope(ctx, t):
    p = _i(t, 15)
    return attention._rope(ctx, _s(t, 0), _s(t, 1), t.src[2], p[1], p[2], p[4], *_f(t, 5, 6, 7, 8, 9, 10), False,
                           p[11:15])


def _soft_max(ctx, t):
    r = ops.soft_max_ext(ctx, _s(t, 0), t.src[1], *_f(t, 0, 1))
    if t.src[2] is not None:
        ops.soft_max_add_sinks(r, t.src[2])
    return r


def _flash_attn(ctx, t):
    r = ops.flash_attn_ext(ctx, _s(t, 0), _s(t, 1), _s(t, 2), t.src[3], *_f(t, 0, 1, 2))
    if t.src[4] is not None:
        ops.flash_attn_ext_add_sinks(r, t.src[4])
    return r


def _glu(ctx, t):
    kind, swapped = _i(t, 2)
    if t.src[1] is None:
        return ops.glu(ctx, _s(t, 0), GluOp(kind), bool(swapped))
    return ops.glu_split(ctx, _s(t, 0), t.src[1], GluOp(kind))


def _strided_write(ctx, t):
    nb1, nb2, nb3, offset, inplace = _i(t, 5)
    build = {Op.SET: (ops.set, ops.set_inplace), Op.ACC: (ops.acc, ops.acc_inplace)}[t.op][inplace != 0]
    return build(ctx, _s(t, 0), _s(t, 1), nb1, nb2, nb3, offset)


def _same_shape(ctx, t):
    """Elementwise ops whose result has the first source's shape."""
    return ctx.new_tensor(t.type, _s(t, 0).ne)


def _unary(ctx, t):
    UnaryOp(t.op_params_i32(0))
    return _same_shape(ctx, t)


_BINARY = {Op.ADD: ops.add, Op.SUB: ops.sub, Op.MUL: ops.mul, Op.DIV: ops.div}

# op -> (sources the op needs, the builder that gives its shape)
_RULES = {
    **{op: (2, lambda ctx, t: _BINARY[t.op](ctx, _s(t, 0), _s(t, 1))) for op in _BINARY},
    **{op: (1, _same_shape) for op in (Op.SQR, Op.SQRT, Op.LOG, Op.SIN, Op.COS, Op.CLAMP, Op.SCALE, Op.FILL,
                                       Op.LEAKY_RELU, Op.CUMSUM, Op.DUP, Op.NORM, Op.RMS_NORM, Op.L2_NORM)},
    Op.UNARY: (1, _unary),
    Op.ADD1: (2, lambda ctx, t: ops.add1(ctx, _s(t, 0), _s(t, 1))),
    Op.ADD_ID: (3, lambda ctx, t: ops.add_id(ctx, _s(t, 0), _s(t, 1), _s(t, 2))),
    Op.ARANGE: (0, lambda ctx, t: ops.arange(ctx, *_f(t, 0, 1, 2))),
    Op.ARGMAX: (1, lambda ctx, t: ops.argmax(ctx, _s(t, 0))),
    Op.ARGSORT: (1, lambda ctx, t: ops.argsort(ctx, _s(t, 0), reduce.SortOrder(t.op_params_i32(0)))),
    Op.TOP_K: (1, lambda ctx, t: ops.top_k(ctx, _s(t, 0), t.ne[0])),
    Op.SUM: (1, lambda ctx, t: ops.sum(ctx, _s(t, 0))),
    Op.SUM_ROWS: (1, lambda ctx, t: ops.sum_rows(ctx, _s(t, 0))),
    Op.MEAN: (1, lambda ctx, t: ops.mean(ctx, _s(t, 0))),
    Op.COUNT_EQUAL: (2, lambda ctx, t: ops.count_equal(ctx, _s(t, 0), _s(t, 1))),
    Op.CONCAT: (2, lambda ctx, t: ops.concat(ctx, _s(t, 0), _s(t, 1), t.op_params_i32(0))),
    Op.CONT: (1, lambda ctx, t: ops.cont_4d(ctx, _s(t, 0), *t.ne)),
    Op.CPY: (2, lambda ctx, t: ops.cpy(ctx, _s(t, 0), _s(t, 1))),
    Op.REPEAT: (1, lambda ctx, t: ops.repeat_4d(ctx, _s(t, 0), *t.ne)),
    Op.REPEAT_BACK: (1, lambda ctx, t: ops.repeat_back(ctx, _s(t, 0), t)),
    Op.PAD: (1, lambda ctx, t: ops.pad_ext(ctx, _s(t, 0), *_i(t, 8))),
    Op.PAD_REFLECT_1D: (1, lambda ctx, t: ops.pad_reflect_1d(ctx, _s(t, 0), *_i(t, 2))),
    Op.ROLL: (1, lambda ctx, t: ops.roll(ctx, _s(t, 0), *_i(t, 4))),
    Op.GET_ROWS: (2, lambda ctx, t: ops.get_rows(ctx, _s(t, 0), _s(t, 1))),
    Op.SET_ROWS: (2, lambda ctx, t: ops.set_rows(ctx, t, _s(t, 0), _s(t, 1))),  # t is a view of the rows set
    Op.DIAG: (1, lambda ctx, t: ops.diag(ctx, _s(t, 0))),
    Op.SET: (2, _strided_write),
    Op.ACC: (2, _strided_write),
    Op.DIAG_MASK_INF: (1, lambda ctx, t: ops.diag_mask_inf(ctx, _s(t, 0), t.op_params_i32(0))),
    Op.DIAG_MASK_ZERO: (1, lambda ctx, t: ops.diag_mask_zero(ctx, _s(t, 0), t.op_params_i32(0))),
    Op.GROUP_NORM: (1, _group_norm),
    Op.MUL_MAT: (2, lambda ctx, t: ops.mul_mat(ctx, _s(t, 0), _s(t, 1))),
    Op.MUL_MAT_ID: (3, lambda ctx, t: ops.mul_mat_id(ctx, _s(t, 0), _s(t, 1), _s(t, 2))),
    Op.OUT_PROD: (2, lambda ctx, t: ops.out_prod(ctx, _s(t, 0), _s(t, 1))),
    Op.SOFT_MAX: (1, _soft_max),
    Op.SOFT_MAX_BACK: (2, lambda ctx, t: ops.soft_max_ext_back(ctx, _s(t, 0), _s(t, 1), *_f(t, 0, 1))),
    Op.ROPE: (2, _rope),
    Op.ROPE_BACK: (2, _rope),
    Op.FLASH_ATTN_EXT: (3, _flash_attn),
    Op.GLU: (1, _glu),
    Op.IM2COL: (2, _im2col),
    Op.CONV_2D: (2, _conv_2d),
    Op.CONV_2D_DW: (2, _conv_2d),
    Op.CONV_TRANSPOSE_1D: (2, _conv_transpose),
    Op.CONV_TRANSPOSE_2D: (2, _conv_transpose),
    Op.POOL_1D: (1, _pool),
    Op.POOL_2D: (1, _pool),
    Op.UPSCALE: (1, lambda ctx, t: ops.interpolate(ctx, _s(t, 0), *t.ne, t.op_params_i32(0))),
    Op.TIMESTEP_EMBEDDING: (1, lambda ctx, t: ops.timestep_embedding(ctx, _s(t, 0), *_i(t, 2))),
}


def check_node(t: Tensor, supports_op) -> None:
    """Refuse a computed node whose op, sources or op_params ggml's builder for that op would not accept."""
    rule = _RULES.get(t.op)
    if rule is None:
        raise Refused(f"node {t.name!r}: op {t.op.name} is not served over RPC")
    n_srcs, build = rule
    missing = [i for i in range(n_srcs) if t.src[i] is None]
    if missing:
        raise Refused(f"node {t.name!r}: {t.op.name} needs src{missing} (it has {n_srcs} required sources)")
    try:
        expected = build(Context(no_alloc=True), t)
        supported = supports_op(t)
    except Refused:
        raise
    except (GGMLError, ValueError, ZeroDivisionError, OverflowError) as e:
        raise Refused(f"node {t.name!r}: {t.op.name} with these sources and op_params {t.op_params} is not one "
                      f"ggml builds: {e}") from None
    if expected.ne != t.ne:
        raise Refused(f"node {t.name!r}: {t.op.name} of these sources gives shape {expected.ne}, the node says {t.ne}")
    if not supported:
        raise Refused(f"node {t.name!r}: {t.op.name} -> {t.type.name} is not supported by the device")


# ----------------------------------------------------------------------------------------------
# Work
# ----------------------------------------------------------------------------------------------
def _per_output(t: Tensor) -> int:
    """Element operations per output element beyond a pass over the operands (reductions, windows)."""
    a = t.src[0]
    if t.op in (Op.MUL_MAT, Op.MUL_MAT_ID):
        return a.ne[0]
    if t.op == Op.OUT_PROD:
        return a.ne[1]
    if t.op == Op.CONV_2D:
        return a.ne[0] * a.ne[1] * a.ne[2]
    if t.op == Op.CONV_2D_DW:
        return a.ne[0] * a.ne[1]
    if t.op == Op.CONV_TRANSPOSE_1D:
        return a.ne[0] * a.ne[2]
    if t.op == Op.CONV_TRANSPOSE_2D:
        return a.ne[0] * a.ne[1] * a.ne[3]
    if t.op == Op.POOL_1D:
        return t.op_params_i32(1)
    if t.op == Op.POOL_2D:
        return t.op_params_i32(1) * t.op_params_i32(2)
    if t.op == Op.FLASH_ATTN_EXT:
        k = t.src[1]
        return k.ne[1] * (a.ne[0] + t.ne[0]) // max(t.ne[0], 1) + 1
    return 1


def node_work(t: Tensor) -> int:
    """Estimated element operations of one node: its outputs times their cost, plus a pass over its sources."""
    return t.nelements * _per_output(t) + sum(s.nelements for s in t.src if s is not None)
