"""The mixture-of-experts FFN every MoE architecture shares (llama.cpp's build_moe_ffn, llama-graph.cpp).

A router (`ffn_gate_inp`, optionally biased) scores the n_expert FFNs for each token; the n_used best
(argsort_top_k) run through `mul_mat_id` on the 3-D expert tensors [n_embd, n_ff, n_expert], and their outputs
are summed, each times its routing weight. The weights are the selected experts' softmax or sigmoid scores, or,
for "softmax_weight" (gpt-oss), the softmax of the selected logits alone; optionally normalised to sum 1 and
scaled. A shared expert (granitemoe, qwen2moe), a plain SwiGLU FFN that every token goes through, optionally
gated by sigmoid(ffn_gate_inp_shexp · x), is added to the routed experts' sum. The graph follows llama.cpp's
op for op, so the numbers (and the experts chosen) agree with it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pyggml.core import Context, Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import Decoder, hparam, hparam_per_layer, linear
from pyggml.models.arch.layers import cb

GATINGS = ("softmax", "sigmoid", "softmax_weight")
ACTIVATIONS = ("silu", "swiglu_oai")
MIN_WEIGHT_SUM = 6.103515625e-5  # llama.cpp clamps the sum of the weights to the smallest normal F16
SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = 1.702, 7.0  # gpt-oss's (llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants)


@dataclass
class SharedExpert:
    gate: Tensor
    up: Tensor
    down: Tensor
    gate_inp: Tensor | None = None   # qwen2moe: the output is scaled by sigmoid(gate_inp · x)

    @classmethod
    def load(cls, w, il: int, n_embd: int, n_ff: int, gated: bool = False) -> SharedExpert:
        p, e, f = f"blk.{il}.", n_embd, n_ff
        return cls(gate=w.get(p + "ffn_gate_shexp.weight", (e, f)), up=w.get(p + "ffn_up_shexp.weight", (e, f)),
                   down=w.get(p + "ffn_down_shexp.weight", (f, e)),
                   gate_inp=w.get(p + "ffn_gate_inp_shexp.weight", (e,)) if gated else None)

    def ffn(self, ctx: Context, cur: Tensor) -> Tensor:
        out = ops.mul_mat(ctx, self.down, ops.swiglu_split(ctx, ops.mul_mat(ctx, self.gate, cur),
                                                           ops.mul_mat(ctx, self.up, cur)))
        return ops.mul(ctx, out, ops.sigmoid(ctx, ops.mul_mat(ctx, self.gate_inp, cur))) if self.gate_inp else out


@dataclass
class Experts:
    """One layer's experts and how it routes.

    `gate` may be absent (llama's files may leave it out: the activation is then silu(up)); the biases are
    per-expert rows [n, n_expert] added with add_id (gpt-oss).
    """

    gate_inp: Tensor
    up: Tensor
    gate: Tensor | None
    down: Tensor
    n_used: int
    gating: str = "softmax"
    norm_w: bool = False
    w_scale: float = 0.0
    activation: str = "silu"
    gate_inp_b: Tensor | None = None
    up_b: Tensor | None = None
    gate_b: Tensor | None = None
    down_b: Tensor | None = None
    shared: SharedExpert | None = None

    @classmethod
    def load(cls, w, il: int, n_embd: int, n_ff: int, n_expert: int, n_used: int, gate_required: bool = True,
             biases: bool = False, **routing) -> Experts:
        """blk.il's ffn_gate_inp and ffn_{up,gate,down}_exps (and their biases where `biases`), shapes checked;
        `routing`: gating, norm_w, w_scale, activation."""
        p, e, f, n = f"blk.{il}.", n_embd, n_ff, n_expert
        bias = w.get if biases else (lambda name, ne: None)
        experts = cls(gate_inp=w.get(p + "ffn_gate_inp.weight", (e, n)), up=w.get(p + "ffn_up_exps.weight", (e, f, n)),
                      gate=(w.get if gate_required else w.optional)(p + "ffn_gate_exps.weight", (e, f, n)),
                      down=w.get(p + "ffn_down_exps.weight", (f, e, n)), n_used=n_used,
                      gate_inp_b=bias(p + "ffn_gate_inp.bias", (n,)), up_b=bias(p + "ffn_up_exps.bias", (f, n)),
                      gate_b=bias(p + "ffn_gate_exps.bias", (f, n)), down_b=bias(p + "ffn_down_exps.bias", (e, n)),
                      **routing)
        if experts.gating not in GATINGS or experts.activation not in ACTIVATIONS:
            raise GGUFError(f"{w.gguf.path}: unknown expert gating {experts.gating!r} or activation "
                            f"{experts.activation!r}")
        return experts


def expert_counts(gguf, n_layer: int) -> tuple[int, int]:
    """(`expert_count`, `expert_used_count`) as llama.cpp checks them: both 0 for a dense model, else
    0 < used <= count. A per-layer `expert_used_count` must hold one value: llama.cpp's MoE graphs select
    layer 0's count of experts in every layer and sum only the layer's own count, which pyggml does not copy."""
    n_expert = hparam(gguf, "expert_count", 0)
    n_used = Decoder.uniform(gguf, "expert_used_count", hparam_per_layer(gguf, "expert_used_count", n_layer, 0))
    if not isinstance(n_expert, int) or not (0 < n_used <= n_expert if n_expert else n_used == 0):
        raise GGUFError(f"{gguf.path}: metadata keys '{gguf.architecture}.expert_count' ({n_expert!r}) and "
                        f"'{gguf.architecture}.expert_used_count' ({n_used!r}) disagree: a layer routes to "
                        f"1..expert_count experts, or both are 0 for a dense model")
    return n_expert, n_used


def moe_ffn(ctx: Context, ex: Experts, cur: Tensor, il: int = -1) -> Tensor:
    """cur [n_embd, n_tokens] through the n_used experts the router picks for each token -> [n_embd, n_tokens];
    the intermediates named as llama.cpp's build_moe_ffn names them in layer il."""
    n_embd, n_tokens, n_expert, k = cur.ne[0], cur.ne[1], ex.gate_inp.ne[1], ex.n_used
    x = cur
    logits = cb(linear(ctx, ex.gate_inp, cur, ex.gate_inp_b), "ffn_moe_logits", il)   # [n_expert, n_tokens]
    if ex.gating == "softmax":
        probs = ops.soft_max(ctx, logits)
    elif ex.gating == "sigmoid":
        probs = ops.sigmoid(ctx, logits)
    else:
        probs = logits
    probs = cb(probs, "ffn_moe_probs", il) if probs is not logits else probs
    selected = cb(ops.argsort_top_k(ctx, probs, k), "ffn_moe_topk", il)         # [k, n_tokens] I32
    weights = ops.get_rows(ctx, ops.reshape_3d(ctx, probs, 1, n_expert, n_tokens), selected)   # [1, k, n_tokens]
    if ex.gating == "softmax_weight":
        weights = ops.reshape_3d(ctx, ops.soft_max(ctx, ops.reshape_2d(ctx, weights, k, n_tokens)), 1, k, n_tokens)
    if ex.norm_w:
        flat = ops.reshape_2d(ctx, weights, k, n_tokens)
        total = ops.clamp(ctx, ops.sum_rows(ctx, flat), MIN_WEIGHT_SUM, math.inf)
        weights = ops.reshape_3d(ctx, ops.div(ctx, flat, total), 1, k, n_tokens)
    if ex.w_scale not in (0.0, 1.0):
        weights = ops.scale(ctx, weights, ex.w_scale)
    weights = cb(weights, "ffn_moe_weights", il)

    cur = ops.reshape_3d(ctx, cur, n_embd, 1, n_tokens)
    up = cb(_biased(ctx, ops.mul_mat_id(ctx, ex.up, cur, selected), ex.up_b, selected), "ffn_moe_up", il)
    if ex.activation == "swiglu_oai":
        gate = _biased(ctx, ops.mul_mat_id(ctx, ex.gate, cur, selected), ex.gate_b, selected)
        act = ops.swiglu_oai(ctx, gate, up, SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT)
    elif ex.gate is not None:
        gate = _biased(ctx, ops.mul_mat_id(ctx, ex.gate, cur, selected), ex.gate_b, selected)
        act = ops.swiglu_split(ctx, gate, up)
    else:
        act = ops.silu(ctx, up)
    act = cb(act, "ffn_moe_act", il)
    out = _biased(ctx, ops.mul_mat_id(ctx, ex.down, act, selected), ex.down_b, selected)
    out = cb(ops.mul(ctx, cb(out, "ffn_moe_down", il), weights), "ffn_moe_weighted", il)   # [n_embd, k, n_tokens]
    # the experts' views summed in order, as llama.cpp adds them
    total = ops.view_2d(ctx, out, n_embd, n_tokens, out.nb[2], 0)
    for i in range(1, k):
        total = ops.add(ctx, total, ops.view_2d(ctx, out, n_embd, n_tokens, out.nb[2], i * out.nb[1]))
    total = ops.cont(ctx, total) if k == 1 else total
    return ops.add(ctx, total, ex.shared.ffn(ctx, x)) if ex.shared is not None else total


def _biased(ctx: Context, x: Tensor, bias: Tensor | None, selected: Tensor) -> Tensor:
    return ops.add_id(ctx, x, bias, selected) if bias is not None else x
