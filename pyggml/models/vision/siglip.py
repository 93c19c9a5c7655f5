"""The SigLIP vision transformer and the projectors on it (llama.cpp's clip_graph_siglip, tools/mtmd/models/siglip.cpp,
over clip_graph::build_vit): patch embedding by a strided conv, learned position embeddings, pre-norm layers with
layer norms, biased q/k/v/out projections and a gelu FFN, the post norm; then per projector type

- idefics3 (SmolVLM): pixel shuffle (scale factor s: s x s neighbouring patches into one token) and one matrix;
- gemma3: average pooling of s x s patches, an RMS norm with `mm.soft_emb_norm.weight`, `mm.input_projection`.

Attention takes llama.cpp's flash-attention path by default (as clip.cpp does on a CPU that has it: K and V cast to
F16, accumulated in F32; no n_pos x n_pos matrix in the compute buffer) or, with flash_attn=False, its plain one
(softmax of the F32 KQ matrix), which the parity checks use. Each intermediate is named as llama.cpp's `cb` names
it.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Context, GGMLType, Tensor
from pyggml.core import ops
from pyggml.core.ops.conv import PoolOp
from pyggml.core.ops.matmul import Prec
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import layer_norm, linear
from pyggml.models.vision.mmproj import VisionHParams


@dataclass
class VitLayer:
    ln_1_w: Tensor
    ln_1_b: Tensor | None
    q_w: Tensor
    q_b: Tensor | None
    k_w: Tensor
    k_b: Tensor | None
    v_w: Tensor
    v_b: Tensor | None
    o_w: Tensor
    o_b: Tensor | None
    ln_2_w: Tensor
    ln_2_b: Tensor | None
    up_w: Tensor
    up_b: Tensor | None
    down_w: Tensor
    down_b: Tensor | None
    gate_w: Tensor | None = None  # a gated FFN (Qwen2.5-VL's SwiGLU)
    gate_b: Tensor | None = None


def vit_layer(w, h: VisionHParams, il: int) -> VitLayer:
    """Layer il's weights (biases and the FFN gate optional), up and down swapped back where a converter swapped
    them."""
    e, p = h.n_embd, f"v.blk.{il}."
    tensors = {}
    for field, name, ne in (("ln_1", "ln1", (e,)), ("ln_2", "ln2", (e,)), ("q", "attn_q", (e, e)),
                            ("k", "attn_k", (e, e)), ("v", "attn_v", (e, e)), ("o", "attn_out", (e, e))):
        tensors[field + "_w"] = w.get(f"{p}{name}.weight", ne)
        tensors[field + "_b"] = w.optional(f"{p}{name}.bias", ne[-1:])
    up, down = w.get(p + "ffn_up.weight"), w.get(p + "ffn_down.weight")
    up_b, down_b = w.optional(p + "ffn_up.bias"), w.optional(p + "ffn_down.bias")
    if down.ne[0] == e and up.ne[0] != e:  # files converted with up and down swapped (llama.cpp swaps them back)
        up, down, up_b, down_b = down, up, down_b, up_b
    if up.ne[:2] != [e, h.n_ff] or down.ne[:2] != [h.n_ff, e]:
        raise GGUFError(f"{w.gguf.path}: {p}ffn_up/ffn_down have shapes {up.ne[:2]}/{down.ne[:2]}, expected "
                        f"[{e}, {h.n_ff}]/[{h.n_ff}, {e}]")
    return VitLayer(**tensors, up_w=up, up_b=up_b, down_w=down, down_b=down_b,
                    gate_w=w.optional(p + "ffn_gate.weight", (e, h.n_ff)), gate_b=w.optional(p + "ffn_gate.bias"))


def patch_embeddings(ctx: Context, kernel: Tensor, image: Tensor, patch: int) -> Tensor:
    """The stride-patch conv as llama.cpp's ggml_conv_2d builds it now: im2col to F16 (F32 for a BF16 kernel),
    then one product whose kernel operand ggml's CPU rounds to F16 too, as an F16 product's second operand
    (pyggml's ops.conv_2d keeps ggml 0.15.3's im2col in the kernel's type). [W/p, H/p, n_embd, 1]."""
    a = kernel
    cols_type = GGMLType.F32 if a.type == GGMLType.BF16 else GGMLType.F16
    cols = ops.im2col(ctx, a, image, patch, patch, 0, 0, 1, 1, True, cols_type)
    kernel = ops.reshape_2d(ctx, a, a.ne[0] * a.ne[1] * a.ne[2], a.ne[3])
    if cols_type == GGMLType.F16 and a.type == GGMLType.F32:
        kernel = ops.cast(ctx, kernel, GGMLType.F16)
    res = ops.mul_mat(ctx, ops.reshape_2d(ctx, cols, cols.ne[0], cols.ne[3] * cols.ne[2] * cols.ne[1]), kernel)
    res = ops.reshape_4d(ctx, res, cols.ne[1], cols.ne[2], cols.ne[3], a.ne[3])
    return ops.cont(ctx, ops.permute(ctx, res, 0, 1, 3, 2))


def vit_attention(ctx: Context, h: VisionHParams, layer: VitLayer, q: Tensor, k: Tensor, v: Tensor, n_pos: int,
                  il: int, flash_attn: bool, mask: Tensor | None = None) -> Tensor:
    """clip_graph::build_attn over q, k, v ([head_dim, n_head, n_pos]), bidirectional, `mask` ([n_pos, n_pos]; F16
    for flash attention, as clip.cpp casts it) added to the scores; then the output projection."""
    hd = h.head_dim
    q, k = ops.permute(ctx, q, 0, 2, 1, 3), ops.permute(ctx, k, 0, 2, 1, 3)
    if flash_attn:  # K and V in F16, accumulated in F32, as clip.cpp's flash-attention path
        k = ops.cast(ctx, k, GGMLType.F16)
        v = ops.cast(ctx, ops.permute(ctx, v, 0, 2, 1, 3), GGMLType.F16)
        out = ops.flash_attn_ext(ctx, q, k, v, mask, hd ** -0.5, 0.0, 0.0)
        ops.flash_attn_ext_set_prec(out, Prec.F32)
        out = ops.reshape_2d(ctx, out, h.n_embd, n_pos).set_name(f"kqv_out-{il}")
    else:
        v = ops.cont(ctx, ops.permute(ctx, v, 1, 2, 0, 3))
        kq = ops.soft_max_ext(ctx, ops.mul_mat(ctx, k, q), mask, hd ** -0.5, 0.0)
        out = ops.permute(ctx, ops.mul_mat(ctx, v, kq), 0, 2, 1, 3)
        out = ops.cont_2d(ctx, out, h.n_embd, n_pos).set_name(f"kqv_out-{il}")
    return linear(ctx, layer.o_w, out, layer.o_b).set_name(f"attn_out-{il}")


class Siglip:
    """The encoder's weights (shapes checked) and its graph for one image of image_size x image_size pixels."""

    def __init__(self, h: VisionHParams, w, flash_attn: bool = True):
        self.h, self.flash_attn = h, flash_attn
        e, n_pos = h.n_embd, h.n_patches_side ** 2
        self.patch_embd = w.get("v.patch_embd.weight", (h.patch_size, h.patch_size, 3, e))
        self.patch_bias = w.optional("v.patch_embd.bias", (e,))
        self.pos_embd = w.get("v.position_embd.weight", (e, n_pos))
        self.post_ln_w = w.optional("v.post_ln.weight", (e,))
        self.post_ln_b = w.optional("v.post_ln.bias", (e,))
        self.layers = [vit_layer(w, h, il) for il in range(h.n_layer)]
        if h.projector == "idefics3":
            if h.scale_factor < 2:
                raise GGUFError(f"{w.gguf.path}: idefics3 needs clip.vision.projector.scale_factor >= 2, "
                                f"got {h.scale_factor}")
            self.fc = w.get("mm.model.fc.weight", (e * h.scale_factor ** 2, None))
            self.n_out = self.fc.ne[1]
        else:  # gemma3
            self.soft_emb_norm = w.get("mm.soft_emb_norm.weight", (e,))
            self.input_proj = w.get("mm.input_projection.weight", (None, e))
            if self.input_proj.type not in (GGMLType.F32, GGMLType.F16):
                raise GGUFError(f"{w.gguf.path}: mm.input_projection.weight is {self.input_proj.type.name}; llama.cpp "
                                f"copies its transpose, which needs F32 or F16")
            self.n_out = self.input_proj.ne[0]

    @property
    def n_tokens(self) -> int:
        """Embeddings one image gives (both projectors merge s x s patches into one)."""
        return (self.h.n_patches_side // self.h.scale_factor) ** 2

    def build(self, ctx: Context, inp_raw: Tensor) -> Tensor:
        """[n_out, n_tokens] embeddings of inp_raw (F32 [W, H, 3, 1], normalised pixels)."""
        h, n_pos = self.h, self.h.n_patches_side ** 2
        cur = self.patch_embeddings(ctx, inp_raw)
        cur = ops.cont(ctx, ops.transpose(ctx, ops.reshape_2d(ctx, cur, n_pos, h.n_embd)))
        if self.patch_bias is not None:
            cur = ops.add(ctx, cur, self.patch_bias).set_name("patch_bias")
        x = ops.add(ctx, cur, self.pos_embd).set_name("pos_embed")
        for il, layer in enumerate(self.layers):
            cur = layer_norm(ctx, x, layer.ln_1_w, layer.ln_1_b, h.eps)
            cur = self.attention(ctx, layer, cur, n_pos, il)
            x = ops.add(ctx, cur, x).set_name(f"ffn_inp-{il}")
            cur = layer_norm(ctx, x, layer.ln_2_w, layer.ln_2_b, h.eps)
            cur = linear(ctx, layer.up_w, cur, layer.up_b)
            cur = ops.gelu(ctx, cur) if h.use_gelu else ops.gelu_quick(ctx, cur)
            cur = linear(ctx, layer.down_w, cur, layer.down_b).set_name(f"ffn_out-{il}")
            x = ops.add(ctx, x, cur).set_name(f"layer_out-{il}")
        if self.post_ln_w is not None:
            x = layer_norm(ctx, x, self.post_ln_w, self.post_ln_b, h.eps)
        return self.pixel_shuffle(ctx, x) if h.projector == "idefics3" else self.pool_project(ctx, x)

    def patch_embeddings(self, ctx: Context, image: Tensor) -> Tensor:
        return patch_embeddings(ctx, self.patch_embd, image, self.h.patch_size)

    def attention(self, ctx: Context, layer: VitLayer, cur: Tensor, n_pos: int, il: int) -> Tensor:
        """Full (bidirectional) attention with biased projections."""
        h = self.h
        q, k, v = (ops.reshape_3d(ctx, linear(ctx, wt, cur, b), h.head_dim, h.n_head, n_pos)
                   for wt, b in ((layer.q_w, layer.q_b), (layer.k_w, layer.k_b), (layer.v_w, layer.v_b)))
        return vit_attention(ctx, h, layer, q, k, v, n_pos, il, self.flash_attn)

    def pixel_shuffle(self, ctx: Context, cur: Tensor) -> Tensor:
        """idefics3: s x s neighbouring patches into one token (llama.cpp's build_patch_merge_permute), projected."""
        s, side, e = self.h.scale_factor, self.h.n_patches_side, self.h.n_embd
        cur = ops.reshape_3d(ctx, cur, e * s, side // s, side)
        cur = ops.permute(ctx, cur, 0, 2, 1, 3)
        cur = ops.cont_3d(ctx, cur, e * s * s, side // s, side // s)
        cur = ops.permute(ctx, cur, 0, 2, 1, 3)
        cur = ops.cont_2d(ctx, cur, cur.ne[0], cur.ne[1] * cur.ne[2]).set_name("pixel_shuffle")
        return ops.mul_mat(ctx, self.fc, cur)

    def pool_project(self, ctx: Context, cur: Tensor) -> Tensor:
        """gemma3: average s x s patches, RMS-norm them with the soft-embedding norm, project to the text width."""
        s, side, e = self.h.scale_factor, self.h.n_patches_side, self.h.n_embd
        cur = ops.cont_4d(ctx, ops.transpose(ctx, cur), side, side, e, 1)
        cur = ops.pool_2d(ctx, cur, PoolOp.AVG, s, s, s, s, 0, 0)
        cur = ops.reshape_3d(ctx, cur, cur.ne[0] * cur.ne[0], e, 1)
        cur = ops.cont(ctx, ops.transpose(ctx, cur))
        cur = ops.mul(ctx, ops.rms_norm(ctx, cur, self.h.eps), self.soft_emb_norm)
        return ops.mul_mat(ctx, ops.cont(ctx, ops.transpose(ctx, self.input_proj)), cur)
