"""Qwen2.5-VL's vision transformer and patch merger (llama.cpp's clip_graph_qwen2vl for `qwen2.5vl_merger`,
tools/mtmd/models/qwen2vl.cpp), for an image of any size that divides into 2 x 2 blocks of patches:

- two patch convolutions added (the temporal patch's two frames; a still image is both), the patches reordered so
  that each 2 x 2 block is consecutive (the merger later takes a block as one row);
- the blocks grouped by attention windows of WINDOW_PIXELS (a gather by `inv_window_idx`), layers with RMS norms,
  biased q/k/v/out, 2-D rotary positions (ggml's rope_multi in VISION mode: the first half of each head rotated by
  the patch's row, the second by its column), every layer but each n_wa_pattern-th attending within its window
  (an additive mask), a SwiGLU FFN with biases;
- the RMS post norm, then the merger: each block's 4 patches as one row through mm.0, gelu, mm.2; the rows put back
  in raster order (`window_idx`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pyggml.core import Context, GGMLType, Tensor
from pyggml.core import ops
from pyggml.core.ops.attention import RopeType
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import linear, rms_norm
from pyggml.models.vision.mmproj import WINDOW_PIXELS, VisionHParams
from pyggml.models.vision.siglip import patch_embeddings, vit_attention, vit_layer

ROPE_ARGS = (32768, 10000.0, 1.0, 0.0, 1.0, 32.0, 1.0)  # n_ctx_orig, base, scale, ext, attn, beta_fast/slow


@dataclass
class GraphInputs:
    """A graph's inputs besides the pixels, filled per image size (see input_values)."""

    positions: Tensor
    window_mask: Tensor | None = None
    inv_window_idx: Tensor | None = None
    window_idx: Tensor | None = None


def window_order(pw: int, ph: int, grid_window: int) -> np.ndarray:
    """The merged tokens (raster index) in window order: windows of grid_window x grid_window tokens row by row,
    each window's tokens row by row (clip.cpp's inv_window_idx)."""
    order = [(y + dy) * pw + x + dx for y in range(0, ph, grid_window) for x in range(0, pw, grid_window)
             for dy in range(min(grid_window, ph - y)) for dx in range(min(grid_window, pw - x))]
    return np.asarray(order, dtype=np.int32)


def window_mask(pw: int, ph: int, grid_window: int) -> np.ndarray:
    """F32 [n_patches, n_patches], patches in window order: 0 within a window, float32's lowest elsewhere."""
    window = np.zeros((ph, pw), np.int64)
    for i, y in enumerate(range(0, ph, grid_window)):
        for j, x in enumerate(range(0, pw, grid_window)):
            window[y:y + grid_window, x:x + grid_window] = i * pw + j
    per_patch = np.repeat(window.reshape(-1)[window_order(pw, ph, grid_window)], 4)
    return np.where(per_patch[:, None] == per_patch[None, :], np.float32(0),
                    np.finfo(np.float32).min).astype(np.float32)


class Qwen25VL:
    """The encoder's weights (shapes checked) and its graph for an image of W x H pixels."""

    def __init__(self, h: VisionHParams, w, flash_attn: bool = True):
        self.h, self.flash_attn = h, flash_attn
        e, p = h.n_embd, h.patch_size
        self.patch_embd = [w.get(name, (p, p, 3, e)) for name in ("v.patch_embd.weight", "v.patch_embd.weight.1")]
        self.pre_ln = w.optional("v.pre_ln.weight", (e,))
        self.post_ln = w.optional("v.post_ln.weight", (e,))
        self.layers = [vit_layer(w, h, il) for il in range(h.n_layer)]
        if any(layer.gate_w is None for layer in self.layers) or not h.use_silu:
            raise GGUFError(f"{w.gguf.path}: qwen2.5vl_merger needs gated FFNs (v.blk.N.ffn_gate.weight) and "
                            f"clip.use_silu")
        self.mm0_w, self.mm0_b = w.get("mm.0.weight", (4 * e, None)), w.get("mm.0.bias")
        self.mm2_w, self.mm2_b = w.get("mm.2.weight", (self.mm0_w.ne[1], None)), w.get("mm.2.bias")
        self.n_out = self.mm2_w.ne[1]
        self.grid_window = WINDOW_PIXELS // p // 2
        if h.n_wa_pattern and self.grid_window < 1:
            raise GGUFError(f"{w.gguf.path}: patch_size {p} is larger than half the {WINDOW_PIXELS}-pixel window")
        self.inputs: GraphInputs | None = None

    def norm(self, ctx: Context, x: Tensor, weight: Tensor | None, bias: Tensor | None = None) -> Tensor:
        x = rms_norm(ctx, x, weight, self.h.eps)
        return x if bias is None else ops.add(ctx, x, bias)

    def build(self, ctx: Context, inp_raw: Tensor) -> Tensor:
        """[n_out, n_tokens] embeddings of inp_raw (F32 [W, H, 3, 1]); sets self.inputs for input_values."""
        h, e = self.h, self.h.n_embd
        pw, ph = inp_raw.ne[0] // h.patch_size, inp_raw.ne[1] // h.patch_size
        n_pos = pw * ph
        conv = [patch_embeddings(ctx, k, inp_raw, h.patch_size) for k in self.patch_embd]
        cur = ops.permute(ctx, ops.add(ctx, *conv), 1, 2, 0, 3)  # [e, pw, ph, 1]
        cur = ops.reshape_4d(ctx, ops.cont_4d(ctx, cur, e * 2, pw // 2, ph, 1), e * 2, pw // 2, 2, ph // 2)
        x = ops.cont_2d(ctx, ops.permute(ctx, cur, 0, 2, 1, 3), e, n_pos)  # 2 x 2 blocks consecutive
        positions = ctx.new_tensor_1d(GGMLType.I32, 4 * n_pos, "positions").set_input()
        self.inputs = GraphInputs(positions)
        if self.pre_ln is not None:
            x = self.norm(ctx, x, self.pre_ln)
        mask = None
        if h.n_wa_pattern:
            inv = ctx.new_tensor_1d(GGMLType.I32, n_pos // 4, "inv_window_idx").set_input()
            mask = ctx.new_tensor_2d(GGMLType.F32, n_pos, n_pos, "window_mask").set_input()
            self.inputs.inv_window_idx, self.inputs.window_mask = inv, mask
            x = ops.reshape_2d(ctx, ops.get_rows(ctx, ops.reshape_2d(ctx, x, 4 * e, n_pos // 4), inv), e, n_pos)
            if self.flash_attn:
                mask = ops.cast(ctx, mask, GGMLType.F16)
        sections = [h.head_dim // 4] * 4
        for il, layer in enumerate(self.layers):
            full = not h.n_wa_pattern or (il + 1) % h.n_wa_pattern == 0
            cur = self.norm(ctx, x, layer.ln_1_w, layer.ln_1_b)
            q, k, v = (ops.reshape_3d(ctx, linear(ctx, wt, cur, b), h.head_dim, h.n_head, n_pos)
                       for wt, b in ((layer.q_w, layer.q_b), (layer.k_w, layer.k_b), (layer.v_w, layer.v_b)))
            q, k = (ops.rope_multi(ctx, t, positions, None, h.head_dim // 2, sections, RopeType.VISION, *ROPE_ARGS)
                    for t in (q, k))
            cur = vit_attention(ctx, h, layer, q, k, v, n_pos, il, self.flash_attn, None if full else mask)
            x = ops.add(ctx, cur, x).set_name(f"ffn_inp-{il}")
            cur = self.norm(ctx, x, layer.ln_2_w, layer.ln_2_b)
            up = linear(ctx, layer.up_w, cur, layer.up_b)
            gate = linear(ctx, layer.gate_w, cur, layer.gate_b)
            cur = linear(ctx, layer.down_w, ops.swiglu_split(ctx, gate, up), layer.down_b).set_name(f"ffn_out-{il}")
            x = ops.add(ctx, x, cur).set_name(f"layer_out-{il}")
        if self.post_ln is not None:
            x = self.norm(ctx, x, self.post_ln)
        cur = ops.gelu(ctx, linear(ctx, self.mm0_w, ops.reshape_2d(ctx, x, 4 * e, n_pos // 4), self.mm0_b))
        out = linear(ctx, self.mm2_w, cur, self.mm2_b)
        if h.n_wa_pattern:
            self.inputs.window_idx = ctx.new_tensor_1d(GGMLType.I32, n_pos // 4, "window_idx").set_input()
            out = ops.get_rows(ctx, out, self.inputs.window_idx)
        return out

    def grid(self, width: int, height: int) -> tuple[int, int]:
        """(columns, rows) of the embeddings an image of width x height pixels gives."""
        return width // self.h.patch_size // 2, height // self.h.patch_size // 2

    def input_values(self, width: int, height: int) -> dict:
        """{input tensor: its values} for an image of width x height pixels (clip_image_batch_encode's)."""
        pw, ph = self.grid(width, height)
        inv = (window_order(pw, ph, self.grid_window) if self.h.n_wa_pattern
               else np.arange(pw * ph, dtype=np.int32))
        slot = np.empty_like(inv)
        slot[inv] = np.arange(len(inv), dtype=np.int32)  # clip.cpp's window_idx: where each token went
        y, x = np.divmod(np.arange(pw * ph), pw)
        dy, dx = np.divmod(np.arange(4), 2)
        rows = (2 * y[:, None] + dy[None, :]).reshape(-1)  # patches of each block in raster block order
        cols = (2 * x[:, None] + dx[None, :]).reshape(-1)
        where = (slot[:, None] * 4 + np.arange(4)[None, :]).reshape(-1)
        pos = np.empty((4, 4 * pw * ph), np.int32)
        pos[0, where], pos[1, where], pos[2, where], pos[3, where] = rows, cols, rows, cols
        values = {self.inputs.positions: pos.reshape(-1)}
        if self.h.n_wa_pattern:
            values |= {self.inputs.inv_window_idx: inv, self.inputs.window_idx: slot,
                       self.inputs.window_mask: window_mask(pw, ph, self.grid_window)}
        return values
