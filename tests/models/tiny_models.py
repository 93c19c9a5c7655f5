"""Small random GGUF models written with gguf.GGUFWriter, with the keys and tensor names llama.cpp expects."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

SPM_PIECES = ["<unk>", "<s>", "</s>"] + list("\u2581abcdefghijklmnopqrstuvwxyz.,") + ["\u2581the", "\u2581a"]


class _Writer(GGUFWriter):
    """GGUFWriter that leaves out the keys and tensors named in `drop` (to write broken files)."""

    def __init__(self, path, arch, drop=()):
        self.drop = set(drop)
        super().__init__(str(path), arch)

    def add_key_value(self, key, val, vtype, sub_type=None):
        if key not in self.drop:
            super().add_key_value(key, val, vtype, sub_type)

    def add_tensor(self, name, tensor, raw_shape=None, raw_dtype=None, tensor_endianess=None):
        if name not in self.drop:
            super().add_tensor(name, tensor, raw_shape, raw_dtype, tensor_endianess)


def _spm_vocab(w: GGUFWriter, n_vocab: int) -> None:
    tokens = SPM_PIECES + [f"<extra_{i}>" for i in range(n_vocab - len(SPM_PIECES))]
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * 3 + [-float(i) for i in range(n_vocab - 3)])
    w.add_token_types([2, 3, 3] + [1] * (len(SPM_PIECES) - 3) + [4] * (n_vocab - len(SPM_PIECES)))
    w.add_uint32("tokenizer.ggml.unknown_token_id", 0)
    w.add_uint32("tokenizer.ggml.bos_token_id", 1)
    w.add_uint32("tokenizer.ggml.eos_token_id", 2)
    w.add_bool("tokenizer.ggml.add_bos_token", True)


def _bpe_vocab(w: GGUFWriter, n_vocab: int) -> None:
    letters = list("abcdefghijklmnopqrstuvwxyz") + ["\u0120", "\u0120t", "th"]
    tokens = letters + ["<|endoftext|>"] + [f"<extra_{i}>" for i in range(n_vocab - len(letters) - 1)]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")
    w.add_token_list(tokens)
    w.add_token_types([1] * len(letters) + [3] + [4] * (n_vocab - len(letters) - 1))
    w.add_token_merges(["\u0120 t", "t h"])
    w.add_uint32("tokenizer.ggml.bos_token_id", len(letters))
    w.add_uint32("tokenizer.ggml.eos_token_id", len(letters))


def _add(w: GGUFWriter, name: str, values: np.ndarray, qtype: GGMLQuantizationType | None) -> None:
    """values in NumPy order (out, in); quantized when asked and the rows are whole blocks."""
    values = values.astype(np.float32)
    if qtype is None or values.ndim < 2:
        w.add_tensor(name, values)
    else:
        w.add_tensor(name, quantize(values, qtype), raw_dtype=qtype)


def write_llama(path, arch: str = "llama", n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,
                n_ff: int = 96, n_layer: int = 2, n_ctx: int = 128, qtype=None, tied: bool = False, seed: int = 0, drop=()):
    """A llama / mistral / qwen2 file (qwen2 gets q, k, v biases); `drop` names keys or tensors to leave out."""
    rng = np.random.default_rng(seed)
    hd = n_embd // n_head
    w = _Writer(path, arch, drop)
    w.add_uint32(f"{arch}.context_length", n_ctx)
    w.add_uint32(f"{arch}.embedding_length", n_embd)
    w.add_uint32(f"{arch}.block_count", n_layer)
    w.add_uint32(f"{arch}.feed_forward_length", n_ff)
    w.add_uint32(f"{arch}.attention.head_count", n_head)
    w.add_uint32(f"{arch}.attention.head_count_kv", n_head_kv)
    w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5)
    w.add_float32(f"{arch}.rope.freq_base", 10000.0)
    w.add_uint32(f"{arch}.rope.dimension_count", hd)
    _spm_vocab(w, n_vocab)

    def mat(n_out, n_in):
        return rng.normal(0, 1 / np.sqrt(n_in), (n_out, n_in))

    _add(w, "token_embd.weight", rng.normal(0, 1, (n_vocab, n_embd)), qtype)
    _add(w, "output_norm.weight", 1 + 0.1 * rng.normal(size=n_embd), None)
    if not tied:
        _add(w, "output.weight", mat(n_vocab, n_embd), qtype)
    for i in range(n_layer):
        p = f"blk.{i}."
        _add(w, p + "attn_norm.weight", 1 + 0.1 * rng.normal(size=n_embd), None)
        _add(w, p + "attn_q.weight", mat(n_head * hd, n_embd), qtype)
        _add(w, p + "attn_k.weight", mat(n_head_kv * hd, n_embd), qtype)
        _add(w, p + "attn_v.weight", mat(n_head_kv * hd, n_embd), qtype)
        _add(w, p + "attn_output.weight", mat(n_embd, n_head * hd), qtype)
        if arch == "qwen2":
            for name, n in (("attn_q", n_head * hd), ("attn_k", n_head_kv * hd), ("attn_v", n_head_kv * hd)):
                _add(w, p + name + ".bias", 0.1 * rng.normal(size=n), None)
        _add(w, p + "ffn_norm.weight", 1 + 0.1 * rng.normal(size=n_embd), None)
        _add(w, p + "ffn_gate.weight", mat(n_ff, n_embd), qtype)
        _add(w, p + "ffn_up.weight", mat(n_ff, n_embd), qtype)
        _add(w, p + "ffn_down.weight", mat(n_embd, n_ff), qtype)
    _write(w)
    return path


def write_gpt2(path, n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_ff: int = 128, n_layer: int = 2,
               n_ctx: int = 128, tied: bool = True, seed: int = 0, qtype=None):
    rng = np.random.default_rng(seed)
    w = GGUFWriter(str(path), "gpt2")
    w.add_uint32("gpt2.context_length", n_ctx)
    w.add_uint32("gpt2.embedding_length", n_embd)
    w.add_uint32("gpt2.block_count", n_layer)
    w.add_uint32("gpt2.feed_forward_length", n_ff)
    w.add_uint32("gpt2.attention.head_count", n_head)
    w.add_float32("gpt2.attention.layer_norm_epsilon", 1e-5)
    _bpe_vocab(w, n_vocab)

    def vec(n, centre=0.0):
        return centre + 0.1 * rng.normal(size=n)

    _add(w, "token_embd.weight", rng.normal(0, 1, (n_vocab, n_embd)), qtype)
    _add(w, "position_embd.weight", rng.normal(0, 0.5, (n_ctx, n_embd)), None)
    _add(w, "output_norm.weight", vec(n_embd, 1.0), None)
    _add(w, "output_norm.bias", vec(n_embd), None)
    if not tied:
        _add(w, "output.weight", rng.normal(0, 0.2, (n_vocab, n_embd)), None)
    for i in range(n_layer):
        p = f"blk.{i}."
        for norm in ("attn_norm", "ffn_norm"):
            _add(w, p + norm + ".weight", vec(n_embd, 1.0), None)
            _add(w, p + norm + ".bias", vec(n_embd), None)
        for name, n_out, n_in in (("attn_qkv", 3 * n_embd, n_embd), ("attn_output", n_embd, n_embd),
                                  ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            _add(w, p + name + ".weight", rng.normal(0, 1 / np.sqrt(n_in), (n_out, n_in)), qtype)
            _add(w, p + name + ".bias", vec(n_out), None)
    _write(w)
    return path


def _write(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
