"""Random-weight mmproj files (the vision encoder and projector llama.cpp's mtmd reads) and a vocabulary holding
the tokens mtmd places around images, for language-model files written by pyggml.testing.synthetic.

The keys and tensor names are those of llama.cpp's convert_hf_to_gguf.py for SigLIP-based projectors
(tools/mtmd/clip-impl.h): `clip.vision.*`, `clip.projector_type`, `v.patch_embd.weight`, `v.blk.N.attn_q.weight`,
`mm.model.fc.weight` (idefics3), `mm.input_projection.weight` and `mm.soft_emb_norm.weight` (gemma3); Qwen2.5-VL's
(`qwen2.5vl_merger`, write_qwen25vl_mmproj): `v.patch_embd.weight.1`, RMS norms without biases, gated FFNs,
`clip.vision.n_wa_pattern`, `mm.0` and `mm.2` with biases.
"""

from __future__ import annotations

import numpy as np
from gguf import GGUFValueType

from pyggml.testing.synthetic import Vocab, _finish, _Writer

# SmolVLM-256M's encoder (SigLIP base, 93M parameters at 512 px) and Gemma 3 4B's (SigLIP so400m at 896 px)
SMOLVLM_256M = dict(projector="idefics3", image_size=512, patch_size=16, n_embd=768, n_ff=3072, n_layer=12,
                    n_head=12, projection_dim=576, scale_factor=4, longest_edge=2048)
GEMMA3_4B = dict(projector="gemma3", image_size=896, patch_size=14, n_embd=1152, n_ff=4304, n_layer=27, n_head=16,
                 projection_dim=2560, scale_factor=4)
TINY_IDEFICS3 = dict(projector="idefics3", image_size=32, patch_size=8, n_embd=32, n_ff=64, n_layer=2, n_head=2,
                     projection_dim=64, scale_factor=2, longest_edge=64)
# Qwen2.5-VL-3B's vision tower (675M parameters; fullatt_block_indexes 7, 15, 23, 31), its text width 2048
QWEN25VL_3B = dict(patch_size=14, n_embd=1280, n_ff=3420, n_layer=32, n_head=16, projection_dim=2048,
                   n_wa_pattern=8)
TINY_QWEN25VL = dict(patch_size=14, n_embd=32, n_ff=48, n_layer=2, n_head=2, projection_dim=64, n_wa_pattern=2)
TINY_GEMMA3 = dict(projector="gemma3", image_size=32, patch_size=4, n_embd=32, n_ff=64, n_layer=2, n_head=2,
                   projection_dim=64, scale_factor=4)

QWEN_IMAGE_TOKENS = ["<|vision_start|>", "<|vision_end|>"]
IMAGE_TOKENS = ["<fake_token_around_image>", "<global-img>", "<start_of_image>", "<end_of_image>"] + [
    f"<row_{r}_col_{c}>" for r in range(1, 5) for c in range(1, 5)]


def write_mmproj(path, projector: str, image_size: int, patch_size: int, n_embd: int, n_ff: int, n_layer: int,
                 n_head: int, projection_dim: int, scale_factor: int, longest_edge: int = 0, qtype=None,
                 seed: int = 0, mean=(0.5, 0.5, 0.5), std=(0.5, 0.5, 0.5), drop=()):
    """An mmproj of SigLIP layers (gelu FFN, layer norms with biases, biased projections) and the projector;
    `qtype` for the matrices (None: F32; the patch embedding stays F16 then, as converters write it); `drop` names
    keys or tensors to leave out."""
    w = _Writer(path, "clip", seed, qtype, drop)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_gelu", True)
    w.add_string("clip.projector_type", projector)
    w.hparams("clip", vision__image_size=image_size, vision__patch_size=patch_size, vision__embedding_length=n_embd,
              vision__feed_forward_length=n_ff, vision__block_count=n_layer, vision__attention__head_count=n_head,
              vision__projection_dim=projection_dim, vision__attention__layer_norm_epsilon=1e-6,
              vision__projector__scale_factor=scale_factor)
    if longest_edge:
        w.hparams("clip", vision__preproc_image_size=longest_edge)
    w.add_array("clip.vision.image_mean", [float(m) for m in mean])
    w.add_array("clip.vision.image_std", [float(s) for s in std])
    n_pos = (image_size // patch_size) ** 2
    patch = w.rng.normal(0, 1 / np.sqrt(3 * patch_size ** 2), (n_embd, 3, patch_size, patch_size))
    w.add_tensor("v.patch_embd.weight", patch.astype(np.float16 if qtype is not None else np.float32))
    w.vector("v.patch_embd.bias", n_embd)
    w.add_tensor("v.position_embd.weight", w.rng.normal(0, 0.5, (n_pos, n_embd)).astype(np.float32))
    for i in range(n_layer):
        p = f"v.blk.{i}."
        for norm in ("ln1", "ln2"):
            w.vector(p + norm + ".weight", n_embd, 1.0)
            w.vector(p + norm + ".bias", n_embd)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.matrix(p + name + ".weight", n_embd, n_embd)
            w.vector(p + name + ".bias", n_embd)
        w.matrix(p + "ffn_up.weight", n_ff, n_embd)
        w.vector(p + "ffn_up.bias", n_ff)
        w.matrix(p + "ffn_down.weight", n_embd, n_ff)
        w.vector(p + "ffn_down.bias", n_embd)
    w.vector("v.post_ln.weight", n_embd, 1.0)
    w.vector("v.post_ln.bias", n_embd)
    if projector == "idefics3":
        w.matrix("mm.model.fc.weight", projection_dim, n_embd * scale_factor ** 2)
    else:
        w.vector("mm.soft_emb_norm.weight", n_embd, 1.0)
        # F32 whatever the type (as converters write it): the graph copies its transpose, which blocks cannot be
        w.add_tensor("mm.input_projection.weight",
                     w.rng.normal(0, 1 / np.sqrt(projection_dim), (n_embd, projection_dim)).astype(np.float32))
    _finish(w)
    return path


def write_qwen25vl_mmproj(path, patch_size: int, n_embd: int, n_ff: int, n_layer: int, n_head: int,
                          projection_dim: int, n_wa_pattern: int, qtype=None, seed: int = 0,
                          mean=(0.48145466, 0.4578275, 0.40821073), std=(0.26862954, 0.26130258, 0.27577711),
                          drop=()):
    """A Qwen2.5-VL mmproj (`qwen2.5vl_merger`) as llama.cpp's converter writes it: two patch kernels (F16 with
    `qtype`), no patch bias or position embeddings, RMS norms, biased q/k/v/out, SwiGLU FFNs with biases, the
    merger's mm.0 (4 n_embd square) and mm.2 (to projection_dim); `drop` names keys or tensors to leave out."""
    w = _Writer(path, "clip", seed, qtype, drop)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.use_silu", True)
    w.add_string("clip.projector_type", "qwen2.5vl_merger")
    w.hparams("clip", vision__image_size=560, vision__patch_size=patch_size, vision__embedding_length=n_embd,
              vision__feed_forward_length=n_ff, vision__block_count=n_layer, vision__attention__head_count=n_head,
              vision__projection_dim=projection_dim, vision__attention__layer_norm_epsilon=1e-6,
              vision__n_wa_pattern=n_wa_pattern)
    w.add_array("clip.vision.image_mean", [float(m) for m in mean])
    w.add_array("clip.vision.image_std", [float(s) for s in std])
    for name in ("v.patch_embd.weight", "v.patch_embd.weight.1"):
        patch = w.rng.normal(0, 1 / np.sqrt(6 * patch_size ** 2), (n_embd, 3, patch_size, patch_size))
        w.add_tensor(name, patch.astype(np.float16 if qtype is not None else np.float32))
    for i in range(n_layer):
        p = f"v.blk.{i}."
        w.vector(p + "ln1.weight", n_embd, 1.0)
        w.vector(p + "ln2.weight", n_embd, 1.0)
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.matrix(p + name + ".weight", n_embd, n_embd)
            w.vector(p + name + ".bias", n_embd)
        for name, n_out, n_in in (("ffn_gate", n_ff, n_embd), ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            w.matrix(p + name + ".weight", n_out, n_in)
            w.vector(p + name + ".bias", n_out)
    w.vector("v.post_ln.weight", n_embd, 1.0)
    w.matrix("mm.0.weight", 4 * n_embd, 4 * n_embd)
    w.vector("mm.0.bias", 4 * n_embd)
    w.matrix("mm.2.weight", projection_dim, 4 * n_embd)
    w.vector("mm.2.bias", projection_dim)
    _finish(w)
    return path


def vision_vocab(image_tokens=tuple(IMAGE_TOKENS)) -> Vocab:
    """A byte-level BPE vocabulary with newlines ("\\n", "\\n\\n" by a merge) and the image tokens of idefics3,
    gemma3 (or `image_tokens`: QWEN_IMAGE_TOKENS for Qwen2.5-VL) as user-defined tokens (mtmd looks them up by
    their text)."""
    pieces = list("abcdefghijklmnopqrstuvwxyz") + ["\u0120", "\u010a", "\u010a\u010a"]
    a, s, u32 = GGUFValueType.ARRAY, GGUFValueType.STRING, GGUFValueType.UINT32
    tokens = pieces + ["<|endoftext|>"] + list(image_tokens)
    return Vocab({"tokenizer.ggml.model": ("gpt2", s, None), "tokenizer.ggml.pre": ("gpt-2", s, None),
                  "tokenizer.ggml.tokens": (tokens, a, s),
                  "tokenizer.ggml.token_type": ([1] * len(pieces) + [3] + [4] * len(image_tokens), a,
                                                GGUFValueType.INT32),
                  "tokenizer.ggml.merges": (["\u010a \u010a"], a, s),
                  "tokenizer.ggml.bos_token_id": (len(pieces), u32, None),
                  "tokenizer.ggml.eos_token_id": (len(pieces), u32, None)})
