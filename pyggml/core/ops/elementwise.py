"""Element-wise arithmetic: dup, add/sub/mul/div (b repeats into a), add_cast, add1, add_id, scale, clamp,
sqr..cos, fill, leaky_relu.

Every result has a's type and shape; the `_inplace` forms return a view of a, as ggml does.
"""

from __future__ import annotations

from pyggml.core import types as T
from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.tensor import Op, Tensor

__all__ = [  # plus add/sub/mul/div and sqr/sqrt/log/sin/cos with their _inplace forms, defined at the end
    "dup", "dup_inplace", "add_cast", "add1", "add1_inplace", "add_id", "scale", "scale_inplace", "scale_bias",
    "scale_bias_inplace", "clamp", "fill", "fill_inplace", "leaky_relu",
]


def same_as(ctx: Context, op: Op, a: Tensor, srcs, params=(), inplace: bool = False) -> Tensor:
    """A result shaped and typed like a: a fresh tensor, or a view of a for the inplace forms."""
    return new_result(ctx, op, a.type, a.ne, srcs, params, inplace_of=a if inplace else None)


def is_padded_1d(t: Tensor) -> bool:
    """ggml_is_padded_1d: elements packed, dims 2 and 3 packed over rows (rows themselves may be padded)."""
    return t.nb[0] == T.type_size(t.type) and t.nb[2] == t.nb[1] * t.ne[1] and t.nb[3] == t.nb[2] * t.ne[2]


def _binary(ctx: Context, op: Op, a: Tensor, b: Tensor, inplace: bool = False) -> Tensor:
    check_shape(b.can_repeat(a), op.name.lower(), "every dim of b must divide the same dim of a", a, b)
    return same_as(ctx, op, a, (a, b), inplace=inplace)


def dup(ctx: Context, a: Tensor) -> Tensor:
    return same_as(ctx, Op.DUP, a, (a,))


def dup_inplace(ctx: Context, a: Tensor) -> Tensor:
    return same_as(ctx, Op.DUP, a, (a,), inplace=True)


def add_cast(ctx: Context, a: Tensor, b: Tensor, type_) -> Tensor:
    """a + b (b's rows repeated into a) with a result of `type_`, for a quantized, F16 or BF16 a."""
    ok = b.ne[0] == a.ne[0] and b.can_repeat(a)
    check_shape(ok, "add_cast", "b must have a's row length and dims that divide a's", a, b)
    check_type(T.is_quantized(a.type) or a.type in (T.GGMLType.F16, T.GGMLType.BF16), "add_cast",
               "a must be quantized, F16 or BF16", a)
    return new_result(ctx, Op.ADD, T.as_type(type_), a.ne, (a, b))


def _add1(ctx: Context, a: Tensor, b: Tensor, inplace: bool) -> Tensor:
    check_shape(b.ne == [1, 1, 1, 1], "add1", "b must be a scalar", a, b)
    check_shape(is_padded_1d(a), "add1", "a must be padded 1d (packed elements, packed dims 2 and 3)", a)
    return same_as(ctx, Op.ADD1, a, (a, b), inplace=inplace)


def add1(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a + the scalar b."""
    return _add1(ctx, a, b, False)


def add1_inplace(ctx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _add1(ctx, a, b, True)


def add_id(ctx: Context, a: Tensor, b: Tensor, ids: Tensor) -> Tensor:
    """a[:, i1, i2] + b[:, ids[i1, i2]]: a per-expert bias picked by id (MoE)."""
    check_shape(a.ne[0] == b.ne[0], "add_id", "a and b need the same ne[0]", a, b)
    check_shape(a.ne[1] == ids.ne[0] and a.ne[2] == ids.ne[1], "add_id",
                "ids must be shaped [a.ne[1], a.ne[2]]", a, ids)
    check_type(ids.type == T.GGMLType.I32, "add_id", "ids must be I32", ids)
    return same_as(ctx, Op.ADD_ID, a, (a, b, ids))


def _scale(ctx: Context, a: Tensor, s: float, b: float, inplace: bool) -> Tensor:
    check_shape(is_padded_1d(a), "scale", "a must be padded 1d (packed elements, packed dims 2 and 3)", a)
    return same_as(ctx, Op.SCALE, a, (a,), (float(s), float(b)), inplace)


def scale(ctx: Context, a: Tensor, s: float) -> Tensor:
    return _scale(ctx, a, s, 0.0, False)


def scale_inplace(ctx: Context, a: Tensor, s: float) -> Tensor:
    return _scale(ctx, a, s, 0.0, True)


def scale_bias(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    """a*s + b."""
    return _scale(ctx, a, s, b, False)


def scale_bias_inplace(ctx: Context, a: Tensor, s: float, b: float) -> Tensor:
    return _scale(ctx, a, s, b, True)


def clamp(ctx: Context, a: Tensor, min: float, max: float) -> Tensor:  # noqa: A002 - ggml's names
    """Always a view of a: ggml's clamp writes in place."""
    return same_as(ctx, Op.CLAMP, a, (a,), (float(min), float(max)), inplace=True)


def _fill(ctx: Context, a: Tensor, c: float, inplace: bool) -> Tensor:
    check_type(a.type in (T.GGMLType.F32, T.GGMLType.F16), "fill", "a must be F32 or F16", a)
    check_shape(a.is_contiguous, "fill", "a must be contiguous", a)
    return same_as(ctx, Op.FILL, a, (a,), (float(c),), inplace)


def fill(ctx: Context, a: Tensor, c: float) -> Tensor:
    """A tensor like a with every element c."""
    return _fill(ctx, a, c, False)


def fill_inplace(ctx: Context, a: Tensor, c: float) -> Tensor:
    return _fill(ctx, a, c, True)


def leaky_relu(ctx: Context, a: Tensor, negative_slope: float, inplace: bool = False) -> Tensor:
    """ggml's signature: the inplace choice is an argument."""
    return same_as(ctx, Op.LEAKY_RELU, a, (a,), (float(negative_slope),), inplace)


def export(namespace: dict, names: list[str], name: str, fn) -> None:
    """Publish a generated builder under ggml's name (ggml_add -> add) in a module and its __all__."""
    fn.__name__ = fn.__qualname__ = name
    namespace[name] = fn
    names.append(name)


def _export_binary(op: Op) -> None:
    name = op.name.lower()
    export(globals(), __all__, name, lambda ctx, a, b: _binary(ctx, op, a, b))
    export(globals(), __all__, f"{name}_inplace", lambda ctx, a, b: _binary(ctx, op, a, b, inplace=True))


def _export_math(op: Op) -> None:
    name = op.name.lower()
    export(globals(), __all__, name, lambda ctx, a: same_as(ctx, op, a, (a,)))
    export(globals(), __all__, f"{name}_inplace", lambda ctx, a: same_as(ctx, op, a, (a,), inplace=True))


for _op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV):
    _export_binary(_op)
for _op in (Op.SQR, Op.SQRT, Op.LOG, Op.SIN, Op.COS):
    _export_math(_op)
