"""Recurrences over a sequence in one node: lstm (pyggml's own op, as ggml's ssm_scan and rwkv_wkv are fused scans).

An LSTM unrolled into ggml's element-wise ops costs about ten nodes per step, each a small kernel launch; one node
runs all the steps in one compiled loop (Silero VAD: a step per 32 ms of audio).
"""

from __future__ import annotations

from pyggml.core.context import Context
from pyggml.core.ops._build import check_shape, check_type, new_result
from pyggml.core.tensor import Op, Tensor
from pyggml.core.types import GGMLType

__all__ = ["lstm"]


def lstm(ctx: Context, gates_x: Tensor, w_hh: Tensor, state: Tensor) -> Tensor:
    """An LSTM cell over n steps, PyTorch's gate order (i, f, g, o): F32 [H, n + 2], the n hidden states and then
    the final [h | c] laid out as `state`.

    gates_x [4H, n]: each step's input projection with both biases (x_t·W_ihᵀ + b_ih + b_hh, one product for
    all steps); w_hh [H, 4H] as mul_mat's a (gates = gates_x[t] + w_hh·h); state [H, 2]: the initial h and c.
    Step t: i, f, o = sigmoid of their gates, g = tanh of its, c = f·c + i·g, h = o·tanh(c).
    """
    hidden = w_hh.ne[0]
    srcs = (gates_x, w_hh, state)
    check_type(all(t.type == GGMLType.F32 for t in srcs), "lstm", "gates_x, w_hh and state must be F32", *srcs)
    check_shape(w_hh.ne[1:] == [4 * hidden, 1, 1], "lstm", f"w_hh must be [H, 4H] (H = w_hh.ne[0] = {hidden})", w_hh)
    check_shape(gates_x.ne[0] == 4 * hidden and gates_x.ne[2:] == [1, 1], "lstm",
                f"gates_x must be [4H = {4 * hidden}, n]", gates_x, w_hh)
    check_shape(state.ne == [hidden, 2, 1, 1], "lstm", f"state must be [H = {hidden}, 2] (h, c)", state, w_hh)
    return new_result(ctx, Op.LSTM, GGMLType.F32, (hidden, gates_x.ne[1] + 2), srcs=srcs)
