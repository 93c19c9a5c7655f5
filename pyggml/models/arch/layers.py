"""The helpers llama.cpp's graph builders share (llama-model.cpp's create_tensor_qkv, llama-graph.cpp's cb,
build_lora_mm, build_qkv and build_ffn), so that each architecture declares and builds only what differs.

Every intermediate an architecture builds is named by `cb` as llama.cpp's callback names it ("attn_norm-0",
"Qcur-0", "ffn_out-0", "l_out-0", "result_norm", "result_output"): a graph dump of pyggml's step and
llama.cpp's GGML_SCHED debug output line up name for name.
"""

from __future__ import annotations

from types import SimpleNamespace

from pyggml.core import Tensor
from pyggml.core import ops
from pyggml.core import types as T


class Layer(SimpleNamespace):
    """One layer's tensors, by llama.cpp's llama_layer field names (None where the file has none)."""


def cb(t: Tensor, name: str, il: int = -1) -> Tensor:
    """t named as llama.cpp's graph callback names it: "name-il" in a layer, "name" outside one (il -1)."""
    return t.set_name(f"{name}-{il}" if il >= 0 else name)


def lora_mm(step, w: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    """w·x plus, for each of the step's LoRA adapters that adapts w, scale·B(A·x) (llama.cpp's build_lora_mm;
    scale = alpha / rank · the adapter's scale), then the bias. Every projection of every architecture goes
    through here, so an adapter reaches whichever matrices its file names."""
    ctx = step.ctx
    y = ops.mul_mat(ctx, w, x)
    for adapter, scale in step.loras:
        pair = adapter.get(w.name)
        if pair is not None:
            a, b = pair
            y = ops.add(ctx, y, ops.scale(ctx, ops.mul_mat(ctx, b, ops.mul_mat(ctx, a, x)),
                                          adapter.scale(pair, scale)))
    return ops.add(ctx, y, bias) if bias is not None else y


def declare_qkv(w, il: int, n_embd: int, n_q: int, n_kv: int, fused: str = "optional") -> dict:
    """Layer il's q, k, v projections as llama.cpp's create_tensor_qkv reads them: one fused `attn_qkv` (with
    its bias, or the three separate biases) or separate `attn_q`, `attn_k`, `attn_v` with optional biases.
    fused "required": only the fused matrix and its bias, both required (gpt2)."""
    p = f"blk.{il}."
    sizes = (("q", n_q), ("k", n_kv), ("v", n_kv))
    none = {f"w{x}": None for x, _ in sizes} | {f"b{x}": None for x, _ in sizes}
    if fused == "required":
        return none | dict(wqkv=w.get(p + "attn_qkv.weight", (n_embd, n_q + 2 * n_kv)),
                           bqkv=w.get(p + "attn_qkv.bias", (n_q + 2 * n_kv,)))
    wqkv = w.optional(p + "attn_qkv.weight", (n_embd, n_q + 2 * n_kv))
    bqkv = w.optional(p + "attn_qkv.bias", (n_q + 2 * n_kv,)) if wqkv is not None else None
    out = none | dict(wqkv=wqkv, bqkv=bqkv)
    if wqkv is None:
        out |= {f"w{x}": w.get(f"{p}attn_{x}.weight", (n_embd, n)) for x, n in sizes}
    if bqkv is None:
        out |= {f"b{x}": w.optional(f"{p}attn_{x}.bias", (n,)) for x, n in sizes}
    return out


def build_qkv(step, layer: Layer, cur: Tensor, head_dim: int, n_head: int, n_head_kv: int, il: int,
              reshape: bool = True, views: bool = False) -> tuple[Tensor, Tensor, Tensor]:
    """Q, K, V of layer il (llama.cpp's build_qkv): [head_dim, heads, n_tokens] each (reshape False: the
    projections [heads·head_dim, n_tokens], as olmo2 normalizes them whole). A fused projection's bias is its
    own or, when only the three separate biases exist, their concatenation; its parts are copied out
    contiguous, as the KV cache stores them (views: views of it, as llama.cpp takes them, for an encoder)."""
    ctx, n = step.ctx, step.n_tokens
    heads = (n_head, n_head_kv, n_head_kv)
    if layer.wqkv is None:
        parts = [lora_mm(step, wt, cur, b) for wt, b in ((layer.wq, layer.bq), (layer.wk, layer.bk),
                                                           (layer.wv, layer.bv))]
        if reshape:
            parts = [ops.reshape_3d(ctx, t, head_dim, h, n) for t, h in zip(parts, heads, strict=True)]
    else:
        bias = layer.bqkv
        if bias is None and None not in (layer.bq, layer.bk, layer.bv):
            bias = ops.concat(ctx, ops.concat(ctx, layer.bq, layer.bk, 0), layer.bv, 0)
        qkv = cb(lora_mm(step, layer.wqkv, cur, bias), "wqkv", il)
        row, parts, offset = T.row_size(qkv.type, head_dim), [], 0
        for h in heads:
            if views and reshape:
                parts.append(ops.view_3d(ctx, qkv, head_dim, h, n, row, qkv.nb[1], row * offset))
            else:
                part = ops.view_2d(ctx, qkv, head_dim * h, n, qkv.nb[1], row * offset)
                parts.append(ops.cont_3d(ctx, part, head_dim, h, n) if reshape else ops.cont(ctx, part))
            offset += h
    return tuple(cb(t, name, il) for t, name in zip(parts, ("Qcur", "Kcur", "Vcur"), strict=True))


def declare_ffn(w, il: int, n_embd: int, n_ff: int, gate: bool = True, biases: bool = False) -> dict:
    """Layer il's dense FFN: `ffn_up`, `ffn_gate` (gate False: none) and `ffn_down`, with optional biases
    where `biases` (llama.cpp's loaders that take them)."""
    p = f"blk.{il}."
    bias = w.optional if biases else (lambda name, ne: None)
    return dict(ffn_gate=w.get(p + "ffn_gate.weight", (n_embd, n_ff)) if gate else None,
                ffn_up=w.get(p + "ffn_up.weight", (n_embd, n_ff)),
                ffn_down=w.get(p + "ffn_down.weight", (n_ff, n_embd)),
                ffn_gate_b=bias(p + "ffn_gate.bias", (n_ff,)) if gate else None,
                ffn_up_b=bias(p + "ffn_up.bias", (n_ff,)), ffn_down_b=bias(p + "ffn_down.bias", (n_embd,)))


GLUS = {"silu": ops.swiglu_split, "gelu": ops.geglu_split}   # the gated FFN's activation of the gate times up
ACTIVATIONS = {"silu": ops.silu, "gelu": ops.gelu}


def build_ffn(step, layer: Layer, cur: Tensor, il: int, act: str = "silu") -> Tensor:
    """Layer il's dense FFN (llama.cpp's build_ffn): act(gate·x) ⊙ (up·x) when the layer has a gate (LLM_FFN_PAR),
    else act(up·x) (LLM_FFN_SEQ), then down; every product through lora_mm, each with its bias if any."""
    ctx = step.ctx
    if layer.ffn_gate is not None:
        gate = cb(lora_mm(step, layer.ffn_gate, cur, layer.ffn_gate_b), "ffn_gate", il)
        up = cb(lora_mm(step, layer.ffn_up, cur, layer.ffn_up_b), "ffn_up", il)
        cur = cb(GLUS[act](ctx, gate, up), f"ffn_{'sw' if act == 'silu' else 'ge'}glu", il)
    else:
        up = cb(lora_mm(step, layer.ffn_up, cur, layer.ffn_up_b), "ffn_up", il)
        cur = cb(ACTIVATIONS[act](ctx, up), f"ffn_{act}", il)
    return cb(lora_mm(step, layer.ffn_down, cur, layer.ffn_down_b), "ffn_down", il)
