"""The torch backend's kernels: for every op they support, the values the NumPy CPU kernels compute.

A kernel reads its sources as float32 torch tensors (shape ne[::-1]) and writes into the
destination's typed view in place. Where ggml's CPU arithmetic is specific (GELU through an F16
table, rope's float32 angle cache, ALiBi slopes), the CPU backend's own helpers build the small
tables and the torch code applies them, so both backends compute the same thing.
Quantized blocks go through gguf's NumPy code on the host, as on the CPU; a quantized mul_mat
weight is dequantized once and cached with its buffer (TorchBuffer.dequantized).

`supports(t)` is the truth about what the backend computes: op AND types. Type rules are the CPU
kernels' where the torch kernel handles every type combination the CPU one does.
"""

from __future__ import annotations

import math
from functools import cache
from typing import Callable

import numpy as np
import torch

from pyggml.backend.cpu import kernels as cpu_kernels
from pyggml.backend.cpu.kernels import unary as cpu_unary
from pyggml.backend.cpu.kernels.attention import _rotated_halves as rotated_halves  # the CPU's pairing, shared
from pyggml.backend.cpu.kernels.attention import alibi_slopes, rope_cos_sin
from pyggml.backend.tensor_io import tensor_buffer
from pyggml.core import types as T
from pyggml.core.tensor import VIEW_OPS, GluOp, Op, Tensor, UnaryOp
from pyggml.errors import BackendError, OutOfBoundsError, UnsupportedOpError

G = T.GGMLType


# ----------------------------------------------------------------------------------------------
# Reading and writing tensors
# ----------------------------------------------------------------------------------------------
def view(t: Tensor) -> torch.Tensor:
    """t's typed strided view in its torch buffer (block types: uint8 rows)."""
    buf = tensor_buffer(t)
    if not hasattr(buf, "view"):
        raise BackendError(f"torch kernels: tensor {t.name!r} lives in {buf!r}, not in a torch buffer")
    return buf.view(t)


def dequantize(t: Tensor, raw: torch.Tensor) -> torch.Tensor:
    """float32 values of a quantized tensor from its raw rows (gguf's NumPy code, on the host)."""
    values = T.to_float(t.type, raw.cpu().numpy())
    host = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    return host.to(raw.device).reshape(tuple(reversed(t.ne)))


def f32(t: Tensor) -> torch.Tensor:
    """t's values as float32, shape ne[::-1]: the view itself for F32."""
    if T.is_quantized(t.type):
        return dequantize(t, view(t))
    v = view(t)
    return v if t.type == G.F32 else v.float()


def weights_f32(t: Tensor) -> torch.Tensor:
    """Like f32, but a quantized tensor is converted once per buffer contents (mul_mat's weights)."""
    return tensor_buffer(t).dequantized(t) if T.is_quantized(t.type) else f32(t)


def store(dst: Tensor, values: torch.Tensor) -> None:
    """Write values (broadcastable to dst's shape) into dst, converting to its type (quantizing on the host)."""
    out = view(dst)
    shape = tuple(reversed(dst.ne))
    if T.is_quantized(dst.type):
        rows = values.float().broadcast_to(shape).cpu().numpy()
        out.copy_(torch.from_numpy(T.from_float(dst.type, rows)).reshape(out.shape))
    else:
        out.copy_(values.broadcast_to(shape))


def repeated(small: torch.Tensor, shape) -> torch.Tensor:
    """small repeated to `shape` the ggml way (element i of a dim reads element i % m); broadcasts when it can."""
    reps = [n // m if m not in (1, n) else 1 for n, m in zip(shape, small.shape, strict=False)]
    return small.repeat(reps) if any(r != 1 for r in reps) else small


def row_ids(dst: Tensor, ids_tensor: Tensor, ids: torch.Tensor, n_rows: int) -> torch.Tensor:
    """ids as int64, checked on the host first (an out-of-range index on CUDA would kill the process)."""
    ids = ids.long()
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= n_rows:
            raise OutOfBoundsError(f"{dst.op.name.lower()} {dst.name!r}: row ids in {ids_tensor.name!r} must lie "
                                   f"in [0, {n_rows}), got [{lo}, {hi}]")
    return ids


def plane_index(n3: int, n2: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Index tensors selecting plane (i3, i2) for every (i3, i2, i) of a gather or scatter."""
    return (torch.arange(n3, device=device)[:, None, None], torch.arange(n2, device=device)[None, :, None])


# ----------------------------------------------------------------------------------------------
# Element-wise
# ----------------------------------------------------------------------------------------------
_BINARY = {Op.ADD: torch.add, Op.SUB: torch.sub, Op.MUL: torch.mul, Op.DIV: torch.div}


def binary(dst: Tensor) -> None:
    a = f32(dst.src[0])
    store(dst, _BINARY[dst.op](a, repeated(f32(dst.src[1]), a.shape)))


def add_id(dst: Tensor) -> None:
    """dst[i3, i2, i1] = src0[i3, i2, i1] + src1 row ids[i2, i1]."""
    a, b, ids = dst.src[0], dst.src[1], dst.src[2]
    rows = row_ids(dst, ids, view(ids)[0, 0, : a.ne[2], : a.ne[1]], b.ne[1])
    store(dst, f32(a) + f32(b)[0, 0][rows][None])


def fill(dst: Tensor) -> None:
    store(dst, torch.tensor(dst.op_params_f32(0), device=view(dst).device))


def add1(dst: Tensor) -> None:
    store(dst, f32(dst.src[0]) + f32(dst.src[1]).reshape(()))


def scale(dst: Tensor) -> None:
    store(dst, f32(dst.src[0]) * dst.op_params_f32(0) + dst.op_params_f32(1))


def clamp(dst: Tensor) -> None:
    store(dst, f32(dst.src[0]).clamp(dst.op_params_f32(0), dst.op_params_f32(1)))


def leaky_relu(dst: Tensor) -> None:
    x = f32(dst.src[0])
    store(dst, x.clamp(min=0) + dst.op_params_f32(0) * x.clamp(max=0))


_MATH = {Op.SQR: torch.square, Op.SQRT: torch.sqrt, Op.LOG: torch.log, Op.SIN: torch.sin, Op.COS: torch.cos}


def math_op(dst: Tensor) -> None:
    store(dst, _MATH[dst.op](f32(dst.src[0])))


# ----------------------------------------------------------------------------------------------
# Unary and GLU
# ----------------------------------------------------------------------------------------------
@cache
def _f16_table(fn, device: torch.device) -> torch.Tensor:
    """The CPU backend's table of fn over every F16 value (ggml's GELU tables), on the device."""
    return torch.from_numpy(cpu_unary.f16_table(fn)).to(device)


def _by_f16_table(fn, x: torch.Tensor) -> torch.Tensor:
    index = x.to(torch.float16).view(torch.int16).to(torch.int64) & 0xFFFF
    return _f16_table(fn, x.device)[index]


def gelu(x: torch.Tensor) -> torch.Tensor:
    """ggml's GELU: the F16 table, 0 below -10 and x above 10."""
    return torch.where(x <= -10, 0.0, torch.where(x >= 10, x, _by_f16_table(cpu_unary.gelu_tanh, x)))


def gelu_quick(x: torch.Tensor) -> torch.Tensor:
    return _by_f16_table(cpu_unary.gelu_quick_exact, x)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x * (1.0 + torch.erf(x * cpu_unary.SQRT_2_INV))


def hardsigmoid(x: torch.Tensor) -> torch.Tensor:
    return ((x + 3.0) / 6.0).clamp(0.0, 1.0)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """C roundf; torch.round rounds halves to even."""
    r = torch.trunc(x)
    return torch.where((x - r).abs() >= 0.5, r + torch.sign(x), r)


UNARY = {
    UnaryOp.ABS: torch.abs,
    UnaryOp.SGN: torch.sign,
    UnaryOp.NEG: torch.neg,
    UnaryOp.STEP: lambda x: (x > 0).float(),
    UnaryOp.TANH: torch.tanh,
    UnaryOp.ELU: lambda x: torch.where(x > 0, x, torch.expm1(x.clamp(max=0))),
    UnaryOp.RELU: lambda x: torch.where(x > 0, x, 0.0),
    UnaryOp.SIGMOID: lambda x: 1.0 / (1.0 + torch.exp(-x)),
    UnaryOp.GELU: gelu,
    UnaryOp.GELU_ERF: gelu_erf,
    UnaryOp.GELU_QUICK: gelu_quick,
    UnaryOp.SILU: lambda x: x / (1.0 + torch.exp(-x)),
    UnaryOp.HARDSWISH: lambda x: x * hardsigmoid(x),
    UnaryOp.HARDSIGMOID: hardsigmoid,
    UnaryOp.EXP: torch.exp,
    UnaryOp.EXPM1: lambda x: torch.exp(x) - 1.0,  # ggml computes expf(x) - 1, not expm1f
    UnaryOp.SOFTPLUS: lambda x: torch.where(x > 20, x, torch.log(1.0 + torch.exp(x.clamp(max=20)))),
    UnaryOp.FLOOR: torch.floor,
    UnaryOp.CEIL: torch.ceil,
    UnaryOp.ROUND: round_half_away,
    UnaryOp.TRUNC: torch.trunc,
}


def unary(dst: Tensor) -> None:
    store(dst, UNARY[dst.unary_op](f32(dst.src[0])))


GLU = {GluOp.REGLU: UNARY[UnaryOp.RELU], GluOp.GEGLU: gelu, GluOp.SWIGLU: UNARY[UnaryOp.SILU],
       GluOp.GEGLU_ERF: gelu_erf, GluOp.GEGLU_QUICK: gelu_quick}


def glu(dst: Tensor) -> None:
    """act(x) * gate, with x and gate the two halves of src0's rows (swapped if asked) or src0 and src1."""
    x, g = cpu_unary.glu_operands(dst, f32)
    if dst.glu_op == GluOp.SWIGLU_OAI:
        alpha, limit = dst.op_params_f32(2), dst.op_params_f32(3)
        x, g = x.clamp(max=limit), g.clamp(-limit, limit)
        store(dst, x / (1.0 + torch.exp(alpha * -x)) * (g + 1.0))
    else:
        store(dst, GLU[dst.glu_op](x) * g)


# ----------------------------------------------------------------------------------------------
# Layout: copies, repeat, concat, rows
# ----------------------------------------------------------------------------------------------
def _blocks(t: Tensor) -> torch.Tensor:
    """A quantized tensor's whole blocks, shape (ne3, ne2, ne1, blocks per row, block bytes)."""
    rows = view(t)
    ts = T.type_size(t.type)
    return rows.as_strided((*rows.shape[:3], rows.shape[3] // ts, ts), (*rows.stride()[:3], ts, 1))


def copy(dst: Tensor) -> None:
    """dst's elements in row-major order are src0's in row-major order (shapes may differ)."""
    src = dst.src[0]
    if src.type == dst.type and T.is_quantized(src.type):
        out = _blocks(dst)
        out.copy_(_blocks(src).reshape(out.shape))
    elif src.type == dst.type:
        out = view(dst)
        out.copy_(view(src).reshape(out.shape))
    else:
        store(dst, f32(src).reshape(tuple(reversed(dst.ne))))


def repeat(dst: Tensor) -> None:
    src = view(dst.src[0])
    view(dst).copy_(src.repeat([n // m for n, m in zip(reversed(dst.ne), src.shape, strict=False)]))


def repeat_back(dst: Tensor) -> None:
    """Each element of dst sums the src0 elements a repeat would have copied from it."""
    x = f32(dst.src[0])
    split = [d for n, m in zip(x.shape, reversed(dst.ne), strict=False) for d in (n // m, m)]
    store(dst, x.reshape(split).sum(dim=(0, 2, 4, 6)))


def pad(dst: Tensor) -> None:
    """op_params: [lp0, rp0, lp1, rp1, lp2, rp2, lp3, rp3, circular]; zeros outside, or wrapped when circular."""
    x = f32(dst.src[0])
    if dst.op_params[8]:
        left = [dst.op_params[2 * d] for d in range(4)][::-1]
        index = [(torch.arange(n, device=x.device) - lp) % m
                 for n, lp, m in zip(reversed(dst.ne), left, x.shape, strict=False)]
        store(dst, x[index[0][:, None, None, None], index[1][None, :, None, None], index[2][None, None, :, None],
                     index[3][None, None, None, :]])
    else:
        store(dst, torch.nn.functional.pad(x, dst.op_params[:8]))


def concat(dst: Tensor) -> None:
    view(dst).copy_(torch.cat([view(dst.src[0]), view(dst.src[1])], dim=3 - dst.op_params[0]))


def get_rows(dst: Tensor) -> None:
    """dst[i12, i11, i10] = src0 row ids[i12, i11, i10] of plane (i12, i11); quantized rows dequantized here."""
    a, b = dst.src[0], dst.src[1]
    rows = view(a)
    ids = row_ids(dst, b, view(b)[0], a.ne[1])
    i3, i2 = plane_index(ids.shape[0], ids.shape[1], rows.device)
    picked = rows[i3, i2, ids]
    if T.is_quantized(a.type):
        picked = torch.from_numpy(T.to_float(a.type, picked.cpu().numpy())).to(rows.device)
    store(dst, picked)


def set_rows(dst: Tensor) -> None:
    """dst row ids[i3 % n12, i2 % n11, i] of plane (i3, i2) = src0 row i of plane (i3, i2), converted."""
    rows, c = f32(dst.src[0]), dst.src[1]
    n3, n2 = rows.shape[:2]
    ids3 = view(c)[0]
    ids = row_ids(dst, c, ids3.repeat(n3 // ids3.shape[0], n2 // ids3.shape[1], 1), dst.ne[1])
    out = view(dst)
    if T.is_quantized(dst.type):
        values = torch.from_numpy(T.from_float(dst.type, rows.cpu().numpy())).to(out.device)
    else:
        values = rows.to(out.dtype)
    i3, i2 = plane_index(n3, n2, out.device)
    out[i3, i2, ids] = values


# ----------------------------------------------------------------------------------------------
# Matrix products
# ----------------------------------------------------------------------------------------------
def _broadcast_split(dst: Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b as (a3, r3, a2, r2, rows, cols), so that a's matrix i2 // r2, i3 // r3 meets b's (i2, i3)."""
    a, b = dst.src[0], dst.src[1]
    wa = weights_f32(a).reshape(a.ne[3], 1, a.ne[2], 1, a.ne[1], a.ne[0])
    wb = f32(b).reshape(a.ne[3], b.ne[3] // a.ne[3], a.ne[2], b.ne[2] // a.ne[2], b.ne[1], b.ne[0])
    return wa, wb


def mul_mat(dst: Tensor) -> None:
    """dst[.., i1, i0] = b[.., i1, :]·a[.., i0, :]."""
    wa, wb = _broadcast_split(dst)
    store(dst, torch.matmul(wb, wa.transpose(-1, -2)).reshape(tuple(reversed(dst.ne))))


def out_prod(dst: Tensor) -> None:
    """dst[.., i1, i0] = sum_k a[.., k, i0]·b[.., k, i1], with mul_mat's broadcasting of a."""
    wa, wb = _broadcast_split(dst)
    store(dst, torch.matmul(wb.transpose(-1, -2), wa).reshape(tuple(reversed(dst.ne))))


def mul_mat_id(dst: Tensor) -> None:
    """dst[t, e, :] = as[ids[t, e]] · b[t, e % b.ne1, :]: one gathered matmul per expert actually used."""
    as_, b, ids = dst.src[0], dst.src[1], dst.src[2]
    experts = weights_f32(as_)[0]                                  # (n_expert, rows, k)
    rows = f32(b)[0]                                               # (n_tokens, n_b, k)
    chosen = row_ids(dst, ids, view(ids)[0, 0], as_.ne[2])         # (n_tokens, n_used)
    slot_of_b = torch.arange(ids.ne[0], device=rows.device) % b.ne[1]
    out = torch.empty((chosen.shape[0], chosen.shape[1], as_.ne[1]), device=rows.device)
    for expert in torch.unique(chosen).tolist():
        tok, slot = torch.nonzero(chosen == expert, as_tuple=True)
        out[tok, slot] = rows[tok, slot_of_b[slot]] @ experts[expert].T
    store(dst, out[None])


# ----------------------------------------------------------------------------------------------
# Normalisation and reductions
# ----------------------------------------------------------------------------------------------
def norm(dst: Tensor) -> None:
    x = f32(dst.src[0])
    centred = x - x.mean(dim=-1, keepdim=True)
    variance = (centred * centred).mean(dim=-1, keepdim=True)
    store(dst, centred / torch.sqrt(variance + dst.op_params_f32(0)))


def rms_norm(dst: Tensor) -> None:
    x = f32(dst.src[0])
    store(dst, x / torch.sqrt((x * x).mean(dim=-1, keepdim=True) + dst.op_params_f32(0)))


def l2_norm(dst: Tensor) -> None:
    x = f32(dst.src[0])
    store(dst, x / torch.sqrt((x * x).sum(dim=-1, keepdim=True)).clamp(min=dst.op_params_f32(0)))


def sum_all(dst: Tensor) -> None:
    store(dst, f32(dst.src[0]).sum(dtype=torch.float64).float())


def sum_rows(dst: Tensor) -> None:
    store(dst, f32(dst.src[0]).sum(dim=-1, keepdim=True, dtype=torch.float64).float())


def mean(dst: Tensor) -> None:
    """The row sum rounded to float, then divided in float (ggml's order)."""
    x = f32(dst.src[0])
    store(dst, x.sum(dim=-1, keepdim=True, dtype=torch.float64).float() / x.shape[-1])


def group_norm(dst: Tensor) -> None:
    """Channels (ne[2]) in groups of ceil(ne2 / n_groups); each group normalised over all its elements."""
    x = f32(dst.src[0])
    per_group = -(-dst.ne[2] // dst.op_params[0])
    eps = dst.op_params_f32(1)
    groups = []
    for start in range(0, dst.ne[2], per_group):  # one step per group: a short loop over a small dim
        xs = x[:, start: start + per_group]
        centred = xs - xs.mean(dim=(1, 2, 3), keepdim=True)
        groups.append(centred / torch.sqrt((centred * centred).mean(dim=(1, 2, 3), keepdim=True) + eps))
    store(dst, torch.cat(groups, dim=1))


def cumsum(dst: Tensor) -> None:
    store(dst, torch.cumsum(f32(dst.src[0]), dim=-1))


def argsort(dst: Tensor) -> None:
    """op_params[0]: 0 ascending, 1 descending; stable, so ties keep index order."""
    x = f32(dst.src[0])
    store(dst, torch.argsort(-x if dst.op_params[0] else x, dim=-1, stable=True))


def top_k(dst: Tensor) -> None:
    """The k largest, best first, then the first two swapped (ggml's way of saying order is not promised)."""
    k = dst.ne[0]
    order = torch.argsort(-f32(dst.src[0]), dim=-1, stable=True)[..., :k]
    if k > 1:
        order = order[..., [1, 0, *range(2, k)]]
    store(dst, order)


def count_equal(dst: Tensor) -> None:
    store(dst, (view(dst.src[0]) == view(dst.src[1])).sum())


def diag(dst: Tensor) -> None:
    x = f32(dst.src[0])
    store(dst, torch.eye(dst.ne[0], device=x.device) * x)


def argmax(dst: Tensor) -> None:
    """Index of each row's maximum; on ties the last one wins, as in ggml_vec_argmax_f32."""
    rows = f32(dst.src[0])
    n = rows.shape[-1]
    store(dst, (n - 1 - torch.argmax(rows.flip(-1), dim=-1)).reshape(tuple(reversed(dst.ne))))


# ----------------------------------------------------------------------------------------------
# Attention: masks, softmax, rope, flash attention
# ----------------------------------------------------------------------------------------------
def diag_mask(dst: Tensor) -> None:
    """src with `value` where column i > n_past + row j (-inf for DIAG_MASK_INF, 0 for DIAG_MASK_ZERO)."""
    x = f32(dst.src[0])
    cols, rows = dst.ne[0], dst.ne[1]
    hidden = torch.arange(cols, device=x.device)[None, :] > dst.op_params_i32(0) + torch.arange(
        rows, device=x.device)[:, None]
    store(dst, x.masked_fill(hidden, -math.inf if dst.op == Op.DIAG_MASK_INF else 0.0))


def exp_rows(scores: torch.Tensor, mask: Tensor | None, max_bias: float, sinks: Tensor | None,
             sum_dtype: torch.dtype) -> torch.Tensor:
    """In place on contiguous scores (ne3, head, rows, cols): += slope[head]*mask (reused by index modulo),
    then exp(scores - row max). Returns each row's denominator (plus exp(sink - max) with sinks).

    The row max includes the sink; an all -inf row is shifted by 0, so it gives zeros, not NaN.
    """
    n3, n_head, n_rows, n_cols = scores.shape
    if mask is not None:
        m = f32(mask)[:, :, :n_rows, :n_cols]
        m3, m2 = m.shape[:2]
        slopes = torch.from_numpy(alibi_slopes(n_head, max_bias)).to(scores.device).reshape(
            1, 1, n_head // m2, m2, 1, 1)
        scores.view(n3 // m3, m3, n_head // m2, m2, n_rows, n_cols).add_(slopes * m[None, :, None, :])
    peak = scores.amax(dim=-1, keepdim=True)
    sink = f32(sinks).reshape(1, -1, 1, 1) if sinks is not None else None
    if sink is not None:
        peak = torch.maximum(peak, sink)
    peak = peak.masked_fill(torch.isneginf(peak), 0.0)
    scores.sub_(peak).exp_()
    total = scores.sum(dim=-1, keepdim=True, dtype=sum_dtype)
    if sink is not None:
        total = total + torch.exp(sink - peak)
    return total


def soft_max(dst: Tensor) -> None:
    a, mask, sinks = dst.src[0], dst.src[1], dst.src[2]
    scores = f32(a) * dst.op_params_f32(0)
    total = exp_rows(scores, mask, dst.op_params_f32(1), sinks, torch.float64)
    store(dst, scores * (1.0 / total).float())


def rope(dst: Tensor) -> None:
    """Rotate pairs of each row by the token's angles (the CPU's angle cache and pairing, every rope mode); copy
    the rest."""
    a, pos, factors = dst.src[0], dst.src[1], dst.src[2]
    positions = view(pos).reshape(-1, a.ne[2]).cpu().numpy()      # (1 or 4 position streams, tokens)
    cos, sin = rope_cos_sin(dst, positions, f32(factors).reshape(-1).cpu().numpy() if factors is not None else None)
    x = f32(a)
    cos, sin = (torch.from_numpy(c).to(x.device)[None, :, None, :] for c in (cos, sin))
    first, second = rotated_halves(dst.op_params_i32(2), dst.op_params_i32(1))
    x0, x1 = x[..., first], x[..., second]
    rotated = x.clone()
    rotated[..., first] = x0 * cos - x1 * sin
    rotated[..., second] = x0 * sin + x1 * cos
    store(dst, rotated)


def _grouped(x: torch.Tensor, n_groups: int) -> torch.Tensor:
    """(ne3, n_head, ..) -> (ne3, n_groups, n_head / n_groups, ..): consecutive heads share one K/V head."""
    return x.reshape(x.shape[0], n_groups, x.shape[1] // n_groups, *x.shape[2:])


def flash_attn_ext(dst: Tensor) -> None:
    """softmax(softcap(q·kᵀ*scale) + slope*mask (+ sinks)) · v, written in ggml's [d_v, head, token] order."""
    q, k, v, mask, sinks = dst.src[:5]
    scale, max_bias, softcap = (dst.op_params_f32(i) for i in range(3))
    n_head, n_kv = q.ne[2], k.ne[1]
    scores = torch.matmul(_grouped(f32(q), k.ne[2]), f32(k)[:, :, None].transpose(-1, -2)).reshape(
        q.ne[3], n_head, q.ne[1], n_kv)
    scores = torch.tanh(scores * (scale / softcap)) * softcap if softcap != 0.0 else scores * scale
    total = exp_rows(scores, mask, max_bias, sinks, torch.float32)
    weighted = torch.matmul(_grouped(scores, v.ne[2]), f32(v)[:, :, None]).reshape(q.ne[3], n_head, q.ne[1], v.ne[0])
    weighted = torch.where(total != 0, weighted / total, 0.0)
    store(dst, weighted.transpose(1, 2))


# ----------------------------------------------------------------------------------------------
# Which ops and types
# ----------------------------------------------------------------------------------------------
def cpu_types(t: Tensor) -> bool:
    """The CPU kernel's type rules: for ops whose torch kernel covers every type combination the CPU one does."""
    return cpu_kernels.KERNELS[t.op].supports(t)


def _unary_supported(t: Tensor) -> bool:
    return t.op_params[0] in UNARY and cpu_types(t)


KERNELS: dict[Op, tuple[Callable[[Tensor], None], Callable[[Tensor], bool]]] = {
    **{op: (binary, cpu_types) for op in (Op.ADD, Op.SUB, Op.MUL, Op.DIV)},
    Op.ADD1: (add1, cpu_types),
    Op.ADD_ID: (add_id, cpu_types),
    Op.FILL: (fill, cpu_types),
    Op.SCALE: (scale, cpu_types),
    Op.CLAMP: (clamp, cpu_types),
    Op.LEAKY_RELU: (leaky_relu, cpu_types),
    **{op: (math_op, cpu_types) for op in _MATH},
    Op.UNARY: (unary, _unary_supported),
    Op.GLU: (glu, cpu_types),
    **{op: (copy, cpu_types) for op in (Op.DUP, Op.CPY, Op.CONT)},
    Op.REPEAT: (repeat, cpu_types),
    Op.REPEAT_BACK: (repeat_back, cpu_types),
    Op.PAD: (pad, cpu_types),
    Op.CONCAT: (concat, cpu_types),
    Op.DIAG: (diag, cpu_types),
    Op.GET_ROWS: (get_rows, cpu_types),
    Op.SET_ROWS: (set_rows, cpu_types),
    Op.MUL_MAT: (mul_mat, cpu_types),
    Op.MUL_MAT_ID: (mul_mat_id, cpu_types),
    Op.OUT_PROD: (out_prod, cpu_types),
    Op.NORM: (norm, cpu_types),
    Op.RMS_NORM: (rms_norm, cpu_types),
    Op.L2_NORM: (l2_norm, cpu_types),
    Op.GROUP_NORM: (group_norm, cpu_types),
    Op.SUM: (sum_all, cpu_types),
    Op.SUM_ROWS: (sum_rows, cpu_types),
    Op.MEAN: (mean, cpu_types),
    Op.ARGMAX: (argmax, cpu_types),
    Op.ARGSORT: (argsort, cpu_types),
    Op.TOP_K: (top_k, cpu_types),
    Op.CUMSUM: (cumsum, cpu_types),
    Op.COUNT_EQUAL: (count_equal, cpu_types),
    Op.DIAG_MASK_INF: (diag_mask, cpu_types),
    Op.DIAG_MASK_ZERO: (diag_mask, cpu_types),
    Op.SOFT_MAX: (soft_max, cpu_types),
    Op.ROPE: (rope, cpu_types),
    Op.FLASH_ATTN_EXT: (flash_attn_ext, cpu_types),
}


def supports(t: Tensor) -> bool:
    if t.op == Op.NONE or t.op in VIEW_OPS:
        return True
    entry = KERNELS.get(t.op)
    return entry is not None and entry[1](t)


def compute(t: Tensor) -> None:
    """Compute one node; views and NONE do nothing (their memory is their source's)."""
    if t.op == Op.NONE or t.op in VIEW_OPS or t.is_empty:
        return
    if not supports(t):
        srcs = ", ".join(f"{s.type.name}{list(s.ne)}" for s in t.srcs)
        raise UnsupportedOpError(f"torch backend has no kernel for {t.op.name} -> {t.type.name} from ({srcs}) "
                                 f"in node {t.name!r}")
    with torch.no_grad():
        KERNELS[t.op][0](t)


def compute_nodes(nodes) -> None:
    for node in nodes:
        compute(node)
