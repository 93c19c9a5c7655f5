"""GGUF models with random weights and real shapes, written with gguf.GGUFWriter.

The same files serve the tests (small models against NumPy and llama.cpp) and the benchmarks (a
realistic-size llama model, an F32 copy of a quantized model): one writer per architecture pyggml
supports (llama / qwen2 / qwen3 / smollm3 / granite, gemma2, gemma3, phi3, gpt2, starcoder2, ...) with the
keys and tensor names llama.cpp expects.

Weights are quantized with `gguf.quants` where it can (F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0); for
the types it can only read (Q2_K..Q6_K, IQ4_NL, IQ4_XS) the blocks themselves are drawn at random:
random quant bytes and sub-block scales under per-block float16 scales chosen so the values have the
asked spread and mean zero -- weights in that type's format without a quantizer.

A vocabulary is either a small synthetic one (SPM pieces or byte-level BPE letters) or a `Vocab` read
from a real model's GGUF (all its tokenizer.* keys, truncated or padded to the model's n_vocab).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize, quantize

from pyggml.errors import GGMLError

QType = GGMLQuantizationType
SPM_PIECES = ["<unk>", "<s>", "</s>"] + list("\u2581abcdefghijklmnopqrstuvwxyz.,") + ["\u2581the", "\u2581a"]

# Types gguf.quants reads but cannot write: byte offsets of the block's float16 scale `d` and of `dmin`.
_SCALE_FIELDS = {QType.Q2_K: (80, 82), QType.Q3_K: (108, None), QType.Q4_K: (0, 2), QType.Q5_K: (0, 2),
                 QType.Q6_K: (208, None), QType.IQ4_NL: (0, None), QType.IQ4_XS: (0, None)}
_ARRAY_KEYS = ("tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
_NORMAL_TOKEN = 1


# ----- vocabularies ---------------------------------------------------------------------------------
@dataclass
class Vocab:
    """The tokenizer.* keys of a model: {key: (value, value type, element type of an array)}."""

    keys: dict

    @classmethod
    def from_gguf(cls, path) -> "Vocab":
        reader = GGUFReader(str(path))
        return cls({name: (f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
                    for name, f in reader.fields.items() if name.startswith("tokenizer.")})

    @property
    def n_tokens(self) -> int:
        return len(self.keys["tokenizer.ggml.tokens"][0])

    def resized(self, n: int) -> "Vocab":
        """The first n tokens, or all of them followed by normal tokens no merge or piece ever produces."""
        keys = dict(self.keys)
        pad = max(0, n - self.n_tokens)
        fill = {"tokenizer.ggml.tokens": [f"<extra_{i}>" for i in range(pad)],
                "tokenizer.ggml.scores": [-1e4] * pad, "tokenizer.ggml.token_type": [_NORMAL_TOKEN] * pad}
        for key in _ARRAY_KEYS:
            if key in keys:
                value, vtype, sub = keys[key]
                keys[key] = (list(value[:n]) + fill[key], vtype, sub)
        return Vocab(keys)

    def write_to(self, w: GGUFWriter) -> None:
        for key, (value, vtype, sub) in self.keys.items():
            w.add_key_value(key, value, vtype, sub)

    def write_vocab_only(self, path, arch: str = "llama") -> None:
        """A file llama.cpp opens with vocab_only (the hyperparameters are placeholders)."""
        w = GGUFWriter(str(path), arch)
        for key, value in [("context_length", 64), ("embedding_length", 8), ("block_count", 1),
                           ("feed_forward_length", 8), ("attention.head_count", 1)]:
            w.add_uint32(f"{arch}.{key}", value)
        w.add_float32(f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)
        self.write_to(w)
        _finish(w)


def spm_vocab(n_vocab: int) -> Vocab:
    """A tiny SentencePiece vocabulary (letters and two words) padded with unused pieces."""
    n = n_vocab - len(SPM_PIECES)
    tokens = SPM_PIECES + [f"<extra_{i}>" for i in range(n)]
    a, u32, f32 = GGUFValueType.ARRAY, GGUFValueType.UINT32, GGUFValueType.FLOAT32
    return Vocab({"tokenizer.ggml.model": ("llama", GGUFValueType.STRING, None),
                  "tokenizer.ggml.tokens": (tokens, a, GGUFValueType.STRING),
                  "tokenizer.ggml.scores": ([0.0] * 3 + [-float(i) for i in range(n_vocab - 3)], a, f32),
                  "tokenizer.ggml.token_type": ([2, 3, 3] + [1] * (len(SPM_PIECES) - 3) + [4] * n, a,
                                                GGUFValueType.INT32),
                  "tokenizer.ggml.unknown_token_id": (0, u32, None), "tokenizer.ggml.bos_token_id": (1, u32, None),
                  "tokenizer.ggml.eos_token_id": (2, u32, None),
                  "tokenizer.ggml.add_bos_token": (True, GGUFValueType.BOOL, None)})


def bpe_vocab(n_vocab: int) -> Vocab:
    """A tiny byte-level BPE vocabulary (letters, two merges, <|endoftext|>) padded with unused tokens."""
    letters = list("abcdefghijklmnopqrstuvwxyz") + ["\u0120", "\u0120t", "th"]
    n = n_vocab - len(letters) - 1
    a, s, u32 = GGUFValueType.ARRAY, GGUFValueType.STRING, GGUFValueType.UINT32
    return Vocab({"tokenizer.ggml.model": ("gpt2", s, None), "tokenizer.ggml.pre": ("gpt-2", s, None),
                  "tokenizer.ggml.tokens": (letters + ["<|endoftext|>"] + [f"<extra_{i}>" for i in range(n)], a, s),
                  "tokenizer.ggml.token_type": ([1] * len(letters) + [3] + [4] * n, a, GGUFValueType.INT32),
                  "tokenizer.ggml.merges": (["\u0120 t", "t h"], a, s),
                  "tokenizer.ggml.bos_token_id": (len(letters), u32, None),
                  "tokenizer.ggml.eos_token_id": (len(letters), u32, None)})


# ----- weights --------------------------------------------------------------------------------------
CALIBRATION_BLOCKS = 1 << 16  # blocks of a drawn K-quant matrix its scales are chosen from (all of a small one)
SLAB_VALUES = 1 << 24         # values of a quantized matrix drawn at a time


def random_weight(rng: np.random.Generator, n_out: int, n_in: int, qtype: QType | None, std: float) -> tuple:
    """(array, raw type) of an (n_out, n_in) matrix with values of spread `std`, in type qtype (None: F32)."""
    if qtype is None or qtype == QType.F32:
        return rng.normal(0, std, (n_out, n_in)).astype(np.float32), None
    block, size = GGML_QUANT_SIZES[qtype]
    if n_in % block:
        raise GGMLError(f"rows of {n_in} values are not whole {qtype.name} blocks of {block}")
    if qtype not in _SCALE_FIELDS:  # a slab of rows at a time: the same values, less memory for large matrices
        slab = max(1, SLAB_VALUES // n_in)
        return np.concatenate([quantize(rng.normal(0, std, (min(slab, n_out - r), n_in)).astype(np.float32), qtype)
                               for r in range(0, n_out, slab)]), qtype
    raw = rng.integers(0, 256, (n_out * n_in // block, size), dtype=np.uint8)
    d_at, dmin_at = _SCALE_FIELDS[qtype]
    sample = raw[:CALIBRATION_BLOCKS]  # the scales' statistics; a whole 8B embedding would take 10 GB

    def values(d: float, dmin: float) -> np.ndarray:
        _set_f16(sample, d_at, d)
        if dmin_at is not None:
            _set_f16(sample, dmin_at, dmin)
        return dequantize(sample, qtype).astype(np.float64)

    scaled, offset = values(1.0, 0.0), (values(0.0, 1.0) if dmin_at is not None else 0.0)
    ratio = -scaled.mean() / offset.mean() if dmin_at is not None else 0.0   # dmin/d that centres the values
    d = std / (scaled + ratio * offset).std()
    ratio, d = float(f"{ratio:.3g}"), float(f"{d:.3g}")  # the same bytes whatever order a machine sums in
    jitter = rng.uniform(0.5, 1.5, (raw.shape[0], 1))                          # blocks differ in scale, as trained ones
    _set_f16(raw, d_at, d * jitter)
    if dmin_at is not None:
        _set_f16(raw, dmin_at, ratio * d * jitter)
    return raw.reshape(n_out, -1), qtype


def _set_f16(raw: np.ndarray, at: int, value) -> None:
    raw[:, at:at + 2] = np.broadcast_to(np.asarray(value, np.float16).reshape(-1, 1), (raw.shape[0], 1)).view(np.uint8)


def _type_of(qtype, name: str):
    """The type for tensor `name`: qtype itself, or from a {name part: type, "*": default} mapping the first
    entry whose part occurs in the name (so "attn_output" listed before "output" keeps them apart)."""
    if not isinstance(qtype, Mapping):
        return qtype
    return next((t for part, t in qtype.items() if part != "*" and part in name), qtype.get("*"))


class _Writer(GGUFWriter):
    """GGUFWriter that leaves out the keys and tensors named in `drop` (to write broken files) and draws
    the weights from one generator."""

    def __init__(self, path, arch: str, seed: int, qtype, drop=()):
        self.drop, self.qtype, self.rng = set(drop), qtype, np.random.default_rng(seed)
        super().__init__(str(path), arch)

    def add_key_value(self, key, val, vtype, sub_type=None):
        if key not in self.drop:
            super().add_key_value(key, val, vtype, sub_type)

    def add_tensor(self, name, tensor, raw_shape=None, raw_dtype=None, tensor_endianess=None):
        if name not in self.drop:
            super().add_tensor(name, tensor, raw_shape, raw_dtype, tensor_endianess)

    def matrix(self, name: str, n_out: int, n_in: int, std: float | None = None, n_expert: int = 0) -> None:
        """A weight in the file's type for `name` (F32 for types whose blocks do not fit its rows); with n_expert
        a 3-D stack of that many matrices (ggml [n_in, n_out, n_expert], the experts of a MoE layer)."""
        values, raw_type = self.draw(name, max(n_expert, 1) * n_out, n_in, std)
        self.add_tensor(name, values.reshape(n_expert, n_out, -1) if n_expert else values, raw_dtype=raw_type)

    def draw(self, name: str, n_out: int, n_in: int, std: float | None = None) -> tuple:
        """(array, raw type) of the weight `matrix` writes: rows that may also be written apart."""
        qtype = _type_of(self.qtype, name)
        if qtype is not None and n_in % GGML_QUANT_SIZES[qtype][0]:
            qtype = None
        return random_weight(self.rng, n_out, n_in, qtype, 1 / np.sqrt(n_in) if std is None else std)

    def attention(self, p: str, n_embd: int, n_q: int, n_kv: int, biases: bool = False) -> None:
        """Layer p's attn_{q,k,v,output} matrices (q n_q wide, k and v n_kv), with q, k, v biases if asked."""
        for name, n_out, n_in in (("attn_q", n_q, n_embd), ("attn_k", n_kv, n_embd), ("attn_v", n_kv, n_embd),
                                  ("attn_output", n_embd, n_q)):
            self.matrix(p + name + ".weight", n_out, n_in)
        for name, n in (("attn_q", n_q), ("attn_k", n_kv), ("attn_v", n_kv)) if biases else ():
            self.vector(p + name + ".bias", n)

    def ffn(self, p: str, n_embd: int, n_ff: int, kind: str = "") -> None:
        """Layer p's ffn_gate, ffn_up and ffn_down matrices (kind "_shexp": a shared expert's)."""
        self.matrix(f"{p}ffn_gate{kind}.weight", n_ff, n_embd)
        self.matrix(f"{p}ffn_up{kind}.weight", n_ff, n_embd)
        self.matrix(f"{p}ffn_down{kind}.weight", n_embd, n_ff)

    def experts(self, p: str, n_embd: int, n_ff: int, n_expert: int, biases: bool = False) -> None:
        """Layer p's router and experts (ffn_gate_inp, ffn_{gate,up,down}_exps), with their biases if asked."""
        self.matrix(p + "ffn_gate_inp.weight", n_expert, n_embd)
        if biases:
            self.vector(p + "ffn_gate_inp.bias", n_expert)
        for name, n_out, n_in in (("ffn_gate_exps", n_ff, n_embd), ("ffn_up_exps", n_ff, n_embd),
                                  ("ffn_down_exps", n_embd, n_ff)):
            self.matrix(p + name + ".weight", n_out, n_in, n_expert=n_expert)
            if biases:
                self.add_tensor(p + name + ".bias", (0.1 * self.rng.normal(size=(n_expert, n_out))).astype(np.float32))

    def vocab_and_head(self, vocab, n_vocab: int, n_embd: int, tied: bool, output_std: float | None) -> None:
        """The vocabulary (`vocab` resized, or an SPM one), token_embd, output_norm and, untied, output.weight
        (std output_std, default 3/sqrt(n_embd): logits of spread ~3)."""
        (vocab.resized(n_vocab) if vocab else spm_vocab(n_vocab)).write_to(self)
        output_std = 3 / np.sqrt(n_embd) if output_std is None else output_std
        self.matrix("token_embd.weight", n_vocab, n_embd, std=output_std if tied else 1.0)
        self.vector("output_norm.weight", n_embd, 1.0)
        if not tied:
            self.matrix("output.weight", n_vocab, n_embd, std=output_std)

    def classifier(self, arch: str, n_embd: int, labels, dense: bool) -> None:
        """A reranker's head: `classifier.output_labels` (when labels has any), cls.output.weight (one row per
        label, at least one) and, dense (bert), cls.weight [n_embd, n_embd] and both heads' biases."""
        if labels:
            self.add_array(f"{arch}.classifier.output_labels", list(labels))
        if dense:
            self.matrix("cls.weight", n_embd, n_embd)
            self.vector("cls.bias", n_embd)
        self.matrix("cls.output.weight", max(len(labels), 1), n_embd, std=3 / np.sqrt(n_embd))
        if dense:
            self.vector("cls.output.bias", max(len(labels), 1))

    def vector(self, name: str, n: int, centre: float = 0.0, spread: float = 0.1) -> None:
        self.add_tensor(name, (centre + spread * self.rng.normal(size=n)).astype(np.float32))

    def hparams(self, arch: str, **values) -> None:
        """`<arch>.<key>` for each keyword (`__` for a dot): floats as F32, strings, bools, int lists (one per
        layer) and bool lists as such, other numbers as U32."""
        for key, value in values.items():
            key = f"{arch}.{key.replace('__', '.')}"
            if isinstance(value, str):
                self.add_string(key, value)
            elif isinstance(value, bool):
                self.add_bool(key, value)
            elif isinstance(value, (list, tuple)):
                self.add_array(key, list(value))
            else:
                (self.add_float32 if isinstance(value, float) else self.add_uint32)(key, value)

    def rope(self, arch: str, scaling: Mapping | None, factors: Mapping | None) -> None:
        """`rope.scaling.<key>` for each entry of `scaling` (type, factor, original_context_length, attn_factor)
        and one F32 tensor per entry of `factors` (rope_freqs, rope_factors_long, rope_factors_short)."""
        self.hparams(arch, **{f"rope__scaling__{k}": v for k, v in (scaling or {}).items()})
        for name, values in (factors or {}).items():
            self.add_tensor(f"{name}.weight", np.asarray(values, np.float32))


def llama3_rope_freqs(n_rot: int, freq_base: float, factor: float = 8.0, low_freq_factor: float = 1.0,
                      high_freq_factor: float = 4.0, n_ctx_orig: int = 8192) -> np.ndarray:
    """`rope_freqs.weight` as Llama 3.1's converter writes it (rope_type "llama3"): 1 for the pairs whose
    wavelength is below n_ctx_orig / high_freq_factor, `factor` above n_ctx_orig / low_freq_factor, smoothly
    between."""
    freqs = 1.0 / freq_base ** (np.arange(0, n_rot, 2, dtype=np.float64) / n_rot)
    wavelen = 2 * np.pi / freqs
    smooth = (n_ctx_orig / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    between = 1 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < n_ctx_orig / high_freq_factor, 1.0,
                   np.where(wavelen > n_ctx_orig / low_freq_factor, factor, between))
    return out.astype(np.float32)


LLAMA_LAYOUTS = ("llama", "qwen2", "qwen3", "smollm3", "granite", "qwen3moe", "qwen2moe", "granitemoe", "qwen2vl")


def write_llama(path, arch: str = "llama", n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2,  # noqa: C901
                n_ff: int = 96, n_layer: int = 2, n_ctx: int = 128, qtype=None, tied: bool = False, seed: int = 0,
                vocab: Vocab | None = None, output_std: float | None = None, drop=(), freq_base: float = 10000.0,
                rope_scaling: Mapping | None = None, rope_factors: Mapping | None = None, head_dim: int | None = None,
                keys: Mapping | None = None, n_expert: int = 0, n_expert_used: int = 0, n_ff_exp: int = 0,
                n_ff_shexp: int = 0, biases=(), classifier=None):
    """A file of the llama layout: llama (rope NORMAL), qwen2 (rope NEOX, q/k/v biases), qwen3 (NEOX, per-head
    q/k norms), smollm3, granite (see write_qwen3, write_granite); `qtype` is one type for every matrix or a
    {name part: type, "*": default} mapping; `vocab` (resized to n_vocab) replaces the synthetic SPM one; the
    output matrix (the token embeddings when tied) has values of spread output_std (default 3/sqrt(n_embd):
    logits of spread ~3); `drop` names keys or tensors to leave out; n_ff may be a list (one per layer);
    `rope_scaling` / `rope_factors` as in _Writer.rope (e.g. {"rope_freqs": llama3_rope_freqs(...)});
    `head_dim` (written as attention.key_length) other than n_embd / n_head; `keys`: more `<arch>.` keys;
    n_expert > 0 (with n_expert_used) makes each FFN that many experts (Mixtral), n_ff wide or n_ff_exp wide
    (written as expert_feed_forward_length, qwen3moe); n_ff_shexp > 0 adds a shared expert that wide (qwen2moe's
    gated by ffn_gate_inp_shexp); `biases` names more optional bias vectors to write: any of attn_q, attn_k,
    attn_v, attn_output, ffn_gate, ffn_up, ffn_down (every layer) and output (the logits'); `classifier` (a list
    of labels, Qwen3-Reranker's ["yes", "no"]) adds a reranker's cls.output.weight and pooling_type rank."""
    if arch not in LLAMA_LAYOUTS:
        raise GGMLError(f"write_llama writes {', '.join(LLAMA_LAYOUTS)} files, not {arch!r} (llama.cpp has no such "
                        f"architecture with this layout)")
    hd, ffs = head_dim or n_embd // n_head, list(n_ff) if isinstance(n_ff, (list, tuple)) else [n_ff] * n_layer
    w = _Writer(path, arch, seed, qtype, drop)
    w.hparams(arch, context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff,
              attention__head_count=n_head, attention__head_count_kv=n_head_kv,
              attention__layer_norm_rms_epsilon=1e-5 if arch != "qwen3" else 1e-6, rope__freq_base=freq_base,
              rope__dimension_count=hd)
    if head_dim:
        w.hparams(arch, attention__key_length=hd, attention__value_length=hd)
    if n_expert:
        w.hparams(arch, expert_count=n_expert, expert_used_count=n_expert_used)
    if n_ff_exp:
        w.hparams(arch, expert_feed_forward_length=n_ff_exp)
    if n_ff_shexp:
        w.hparams(arch, expert_shared_feed_forward_length=n_ff_shexp)
    w.hparams(arch, **(keys or {}))
    w.rope(arch, rope_scaling, rope_factors)
    w.vocab_and_head(vocab, n_vocab, n_embd, tied, output_std)
    if "output" in biases:
        w.vector("output.bias", n_vocab, spread=1.0)
    if classifier is not None:
        w.hparams(arch, pooling_type=POOLING_TYPES["rank"])
        w.classifier(arch, n_embd, classifier, dense=False)
    for i in range(n_layer):
        p = f"blk.{i}."
        sizes = dict(attn_q=n_head * hd, attn_k=n_head_kv * hd, attn_v=n_head_kv * hd, attn_output=n_embd,
                     ffn_gate=ffs[i], ffn_up=ffs[i], ffn_down=n_embd)
        for name in biases:
            if name != "output":
                w.vector(f"{p}{name}.bias", sizes[name])
        w.vector(p + "attn_norm.weight", n_embd, 1.0)
        w.attention(p, n_embd, n_head * hd, n_head_kv * hd, biases=arch in ("qwen2", "qwen2moe", "qwen2vl"))
        if arch in ("qwen3", "qwen3moe"):
            w.vector(p + "attn_q_norm.weight", hd, 1.0)
            w.vector(p + "attn_k_norm.weight", hd, 1.0)
        w.vector(p + "ffn_norm.weight", n_embd, 1.0)
        if n_expert:
            w.experts(p, n_embd, n_ff_exp or ffs[i], n_expert)
        else:
            w.ffn(p, n_embd, ffs[i])
        if n_ff_shexp:
            w.ffn(p, n_embd, n_ff_shexp, "_shexp")
            if arch == "qwen2moe":
                w.vector(p + "ffn_gate_inp_shexp.weight", n_embd, spread=1 / np.sqrt(n_embd))
    _finish(w)
    return path


def write_qwen3(path, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32, **kw):
    """A Qwen 3 file: per-head q/k RMS norms, head_dim other than n_embd / n_head (Qwen3-0.6B: 1024 wide,
    16 heads of 128), GQA, rope NEOX with base 1e6, tied output as the small Qwen 3 models."""
    kw.setdefault("tied", True)
    kw.setdefault("freq_base", 1000000.0)
    return write_llama(path, "qwen3", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim, **kw)


def write_qwen2vl(path, sections=(2, 3, 3, 0), **kw):
    """Qwen2.5-VL's language model (`qwen2vl`): qwen2's layout (q/k/v biases) with M-RoPE, `sections` the dim
    pairs each position stream (time, height, width, extra) rotates (Qwen2.5-VL's [16, 24, 24, 0] scaled to the
    default head size of 16)."""
    keys = {"rope__dimension_sections": list(sections)} | dict(kw.pop("keys", None) or {})
    kw.setdefault("freq_base", 1000000.0)
    return write_llama(path, "qwen2vl", keys=keys, **kw)


def write_mixtral(path, n_expert: int = 8, n_expert_used: int = 2, **kw):
    """A Mixtral-style `llama` file: every FFN 8 experts of n_ff, 2 used per token (Mixtral 8x7B's routing),
    GQA 4:1 as Mixtral's 32/8 heads, rope base 1e6."""
    kw.setdefault("n_head", 8)
    kw.setdefault("n_head_kv", 2)
    kw.setdefault("freq_base", 1000000.0)
    return write_llama(path, "llama", n_expert=n_expert, n_expert_used=n_expert_used, **kw)


def write_qwen3moe(path, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 1, head_dim: int = 32,
                   n_expert: int = 16, n_expert_used: int = 4, n_ff_exp: int = 32, **kw):
    """A Qwen3-MoE file (Qwen3-30B-A3B's structure scaled down: head_dim other than n_embd / n_head, GQA 4:1,
    16 experts with 4 used (its 128 and 8 would leave most experts idle on a short test), experts narrower than
    the dense feed_forward_length), per-head q/k norms, rope NEOX base 1e6, separate output."""
    kw.setdefault("freq_base", 1000000.0)
    return write_llama(path, "qwen3moe", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, head_dim=head_dim,
                       n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, **kw)


def write_qwen2moe(path, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 4, n_ff: int = 128, n_expert: int = 8,
                   n_expert_used: int = 4, n_ff_exp: int = 32, n_ff_shexp: int = 128, **kw):
    """A Qwen2-MoE file (Qwen1.5-MoE-A2.7B's structure scaled down: 60 experts with 4 used there, 8 here;
    experts narrower than the shared expert; q/k/v biases; no GQA), rope NEOX base 1e6, separate output."""
    kw.setdefault("freq_base", 1000000.0)
    return write_llama(path, "qwen2moe", n_embd=n_embd, n_head=n_head, n_head_kv=n_head_kv, n_ff=n_ff,
                       n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp, n_ff_shexp=n_ff_shexp, **kw)


def write_smollm3(path, n_layer: int = 4, **kw):
    """A SmolLM3 file: the llama layout (tied, GQA 4:1 as SmolLM3-3B), NoPE on every 4th layer."""
    kw.setdefault("tied", True)
    return write_llama(path, "smollm3", n_layer=n_layer, **kw)


def write_granite(path, embedding_scale: float = 12.0, residual_scale: float = 0.22,
                  attention_scale: float = 0.0078125, logit_scale: float = 8.0, arch: str = "granite", **kw):
    """A Granite 3.x dense file with its four scales (granite-3.1-2b's: embedding 12, residual 0.22,
    attention 1/128, logits / 8), tied output; arch "granitemoe" with n_expert (and n_ff_shexp) for the MoE."""
    kw.setdefault("tied", True)
    return write_llama(path, arch, keys=dict(embedding_scale=embedding_scale, residual_scale=residual_scale,
                                                  attention__scale=attention_scale, logit_scale=logit_scale), **kw)


def write_gpt_oss(path, n_vocab: int = 64, n_embd: int = 96, n_head: int = 8, n_head_kv: int = 1, head_dim: int = 32,
                  n_ff_exp: int = 64, n_layer: int = 4, n_expert: int = 8, n_expert_used: int = 4, n_ctx: int = 128,
                  sliding_window: int = 8, rope_scaling: Mapping | None = None, qtype=None, seed: int = 0,
                  vocab: Vocab | None = None, output_std: float | None = None, drop=()):
    """A gpt-oss file, gpt-oss-20b's structure scaled down: n_embd other than n_head * head_dim, GQA 8:1,
    q/k/v/output biases, attention sinks, sliding window on even layers, YaRN (by default factor 4 over an
    original context of 32, for the released 32 over 4096), rope NEOX base 150000, the pre-FFN norm named
    post_attention_norm, experts with biases and a biased router (4 of 8 used, as 4 of 32), separate output.
    Its experts are MXFP4 in the released files (qtype {"_exps": MXFP4, ...})."""
    arch, n_q, n_kv = "gpt-oss", n_head * head_dim, n_head_kv * head_dim
    w = _Writer(path, arch, seed, qtype, drop)
    w.hparams(arch, context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff_exp,
              attention__head_count=n_head, attention__head_count_kv=n_head_kv, attention__key_length=head_dim,
              attention__value_length=head_dim, attention__layer_norm_rms_epsilon=1e-5,
              attention__sliding_window=sliding_window, rope__freq_base=150000.0, rope__dimension_count=head_dim,
              expert_count=n_expert, expert_used_count=n_expert_used, expert_feed_forward_length=n_ff_exp)
    w.rope(arch, {"type": "yarn", "factor": 4.0, "original_context_length": 32} if rope_scaling is None
           else rope_scaling, None)
    w.vocab_and_head(vocab, n_vocab, n_embd, False, output_std)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.vector(p + "attn_norm.weight", n_embd, 1.0)
        w.attention(p, n_embd, n_q, n_kv, biases=True)
        w.vector(p + "attn_output.bias", n_embd)
        w.vector(p + "attn_sinks.weight", n_head, spread=1.0)
        w.vector(p + "post_attention_norm.weight", n_embd, 1.0)
        w.experts(p, n_embd, n_ff_exp, n_expert, biases=True)
    _finish(w)
    return path


def write_olmo2(path, n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, n_ff: int = 96,
                n_layer: int = 4, n_ctx: int = 128, sliding_window: int = 0, rope_scaling: Mapping | None = None,
                qtype=None, seed: int = 0, vocab: Vocab | None = None, output_std: float | None = None, drop=()):
    """An OLMo 2 file (no pre-norms; q/k norms over the whole projection; post-attention and post-FFN norms;
    rope NEOX base 500000; separate output); with a sliding window an OLMo 3 one: the window on every layer but
    each 4th, written as the converter writes it (one bool per layer), and `rope_scaling` (OLMo 3: YaRN) for
    the global layers."""
    arch, hd = "olmo2", n_embd // n_head
    w = _Writer(path, arch, seed, qtype, drop)
    w.hparams(arch, context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff,
              attention__head_count=n_head, attention__head_count_kv=n_head_kv, attention__layer_norm_rms_epsilon=1e-6,
              rope__freq_base=500000.0)
    if sliding_window:
        w.hparams(arch, attention__sliding_window=sliding_window,
                  attention__sliding_window_pattern=[(i + 1) % 4 != 0 for i in range(n_layer)])
    w.rope(arch, rope_scaling, None)
    w.vocab_and_head(vocab, n_vocab, n_embd, False, output_std)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.attention(p, n_embd, n_embd, n_head_kv * hd)
        for norm, n in (("attn_q_norm", n_embd), ("attn_k_norm", n_head_kv * hd), ("post_attention_norm", n_embd),
                        ("post_ffw_norm", n_embd)):
            w.vector(p + norm + ".weight", n, 1.0)
        w.ffn(p, n_embd, n_ff)
    _finish(w)
    return path


# SmolLM-135M's shapes: a llama model of realistic size for benchmarks (134 M parameters, tied output).
SMALL_LLAMA = dict(arch="llama", n_vocab=49152, n_embd=576, n_head=9, n_head_kv=3, n_ff=1536, n_layer=30, n_ctx=2048,
                   tied=True)


def write_small_llama(path, qtype, vocab: Vocab, seed: int = 0):
    """SMALL_LLAMA with every matrix in qtype and `vocab` (e.g. a GPT-2 BPE one) padded to 49152 tokens."""
    return write_llama(path, qtype=qtype, vocab=vocab, seed=seed, **SMALL_LLAMA)


def write_gemma3(path, n_vocab: int = 64, n_embd: int = 64, n_head: int = 3, n_head_kv: int = 1, head_dim: int = 32,
                 n_ff: int = 128, n_layer: int = 7, n_ctx: int = 128, sliding_window: int = 16, qtype=None,
                 seed: int = 0, vocab: Vocab | None = None, embd_std: float | None = None, swa_pattern=None,
                 freq_base_swa: float | None = None):
    """A Gemma 3 file: q/k norms, pre- and post-norms, tied output, rope NEOX, head_dim independent of
    n_embd / n_head, and (with n_layer >= 6) sliding-window layers next to a global one; `swa_pattern`
    (a period or one bool per layer) and `freq_base_swa` write those keys."""
    keys = dict(attention__sliding_window=sliding_window, rope__freq_base=1000000.0,
                attention__sliding_window_pattern=swa_pattern, rope__freq_base_swa=freq_base_swa)
    return _write_gemma(path, "gemma3", keys, n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx,
                        qtype, seed, vocab, embd_std)


def write_gemma2(path, n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_head_kv: int = 2, head_dim: int = 32,
                 n_ff: int = 128, n_layer: int = 4, n_ctx: int = 128, sliding_window: int | None = 16, qtype=None,
                 seed: int = 0, vocab: Vocab | None = None, embd_std: float | None = None, swa_pattern=None,
                 freq_base_swa: float | None = None, attn_softcap: float | None = 50.0,
                 final_softcap: float | None = 30.0):
    """A Gemma 2 file (Gemma 2 2B's layout scaled down: GQA 2:1, head_dim independent of n_embd / n_head,
    tied output, no q/k norms): the soft-caps (None: left out, llama.cpp's defaults 50 and 30 apply), the
    sliding window (None: left out, 4096 applies) on every other layer unless `swa_pattern` says, and
    `freq_base_swa` as keys."""
    keys = dict(attention__sliding_window=sliding_window, attn_logit_softcapping=attn_softcap,
                final_logit_softcapping=final_softcap, attention__sliding_window_pattern=swa_pattern,
                rope__freq_base_swa=freq_base_swa)
    return _write_gemma(path, "gemma2", keys, n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx,
                        qtype, seed, vocab, embd_std)


def _write_gemma(path, arch, keys, n_vocab, n_embd, n_head, n_head_kv, head_dim, n_ff, n_layer, n_ctx, qtype, seed,
                 vocab, embd_std):
    """Gemma 2 and 3's layout (Gemma 3 adds per-head q/k norms); `keys` left out where None."""
    w = _Writer(path, arch, seed, qtype)
    w.hparams(arch, context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff,
              attention__head_count=n_head, attention__head_count_kv=n_head_kv, attention__key_length=head_dim,
              attention__value_length=head_dim, attention__layer_norm_rms_epsilon=1e-6)
    w.hparams(arch, **{k: v for k, v in keys.items() if v is not None})
    (vocab.resized(n_vocab) if vocab else spm_vocab(n_vocab)).write_to(w)
    embd_std = 3 / np.sqrt(n_embd) if embd_std is None else embd_std        # tied output: logits of spread ~3
    w.matrix("token_embd.weight", n_vocab, n_embd, std=embd_std)
    w.vector("output_norm.weight", n_embd, 1.0)
    qk_norms = [("attn_q_norm", head_dim), ("attn_k_norm", head_dim)] if arch == "gemma3" else []
    norms = [("attn_norm", n_embd), *qk_norms, ("post_attention_norm", n_embd), ("ffn_norm", n_embd),
             ("post_ffw_norm", n_embd)]
    for i in range(n_layer):
        p = f"blk.{i}."
        for norm, n in norms:
            w.vector(p + norm + ".weight", n, 1.0)
        w.matrix(p + "attn_q.weight", n_head * head_dim, n_embd)
        w.matrix(p + "attn_k.weight", n_head_kv * head_dim, n_embd)
        w.matrix(p + "attn_v.weight", n_head_kv * head_dim, n_embd)
        w.matrix(p + "attn_output.weight", n_embd, n_head * head_dim)
        w.matrix(p + "ffn_gate.weight", n_ff, n_embd)
        w.matrix(p + "ffn_up.weight", n_ff, n_embd)
        w.matrix(p + "ffn_down.weight", n_embd, n_ff)
    _finish(w)
    return path


def longrope_factors(n_pairs: int, long_max: float = 40.0) -> dict:
    """LongRoPE's `rope_factors_short` / `rope_factors_long` shaped like Phi-3-mini-128k's: per pair, short
    factors rising from 1 to about 2, long ones from 1 to long_max, both faster for the low frequencies."""
    t = np.linspace(0.0, 1.0, n_pairs) ** 2
    return {"rope_factors_short": 1.0 + t, "rope_factors_long": long_max ** t}


def write_phi3(path, n_vocab: int = 64, n_embd: int = 96, n_head: int = 4, n_head_kv: int = 4, n_ff: int = 128,
               n_layer: int = 2, n_ctx: int = 256, n_ctx_orig: int | None = None, rope_dims: int | None = None,
               tied: bool = False, fused_qkv: bool = True, qtype=None, seed: int = 0, vocab: Vocab | None = None,
               output_std: float | None = None, sliding_window: int = 0):
    """A Phi-3 file as the converter writes one: attn_qkv (or, fused_qkv False, the same rows as attn_q, attn_k,
    attn_v), ffn_up holding gate and up (2·n_ff rows), RoPE over rope_dims (default head_dim; Phi-4-mini rotates
    3/4), `sliding_window` (llama.cpp ignores it). With n_ctx_orig below n_ctx: LongRoPE, i.e.
    rope.scaling.original_context_length, the short and long factors and rope.scaling.attn_factor
    sqrt(1 + ln(n_ctx / n_ctx_orig) / ln(n_ctx_orig)) as the converter computes it."""
    hd = n_embd // n_head
    n_rot, n_kv = rope_dims or hd, n_head_kv * hd
    w = _Writer(path, "phi3", seed, qtype)
    w.hparams("phi3", context_length=n_ctx, embedding_length=n_embd, feed_forward_length=n_ff, block_count=n_layer,
              attention__head_count=n_head, attention__head_count_kv=n_head_kv,
              attention__layer_norm_rms_epsilon=1e-5, rope__dimension_count=n_rot, rope__freq_base=10000.0,
              attention__sliding_window=sliding_window)
    if n_ctx_orig:
        attn_factor = float(np.sqrt(1 + np.log(n_ctx / n_ctx_orig) / np.log(n_ctx_orig)))
        w.rope("phi3", {"original_context_length": n_ctx_orig, "attn_factor": attn_factor},
               longrope_factors(n_rot // 2))
    w.vocab_and_head(vocab, n_vocab, n_embd, tied, output_std)
    for i in range(n_layer):
        p = f"blk.{i}."
        w.vector(p + "attn_norm.weight", n_embd, 1.0)
        qkv, raw_type = w.draw(p + "attn_qkv.weight", n_embd + 2 * n_kv, n_embd)
        if fused_qkv:
            w.add_tensor(p + "attn_qkv.weight", qkv, raw_dtype=raw_type)
        else:
            for name, rows in (("attn_q", slice(0, n_embd)), ("attn_k", slice(n_embd, n_embd + n_kv)),
                               ("attn_v", slice(n_embd + n_kv, None))):
                w.add_tensor(f"{p}{name}.weight", qkv[rows], raw_dtype=raw_type)
        w.matrix(p + "attn_output.weight", n_embd, n_embd)
        w.vector(p + "ffn_norm.weight", n_embd, 1.0)
        w.matrix(p + "ffn_up.weight", 2 * n_ff, n_embd)
        w.matrix(p + "ffn_down.weight", n_embd, n_ff)
    _finish(w)
    return path


def write_gpt2(path, n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_ff: int = 128, n_layer: int = 2,
               n_ctx: int = 128, tied: bool = True, seed: int = 0, qtype=None, vocab: Vocab | None = None):
    """A GPT-2 file: learned positions, layer norms with biases, fused QKV, GELU; the synthetic vocabulary
    is byte-level BPE."""
    w = _Writer(path, "gpt2", seed, qtype)
    w.hparams("gpt2", context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff,
              attention__head_count=n_head, attention__layer_norm_epsilon=1e-5)
    (vocab.resized(n_vocab) if vocab else bpe_vocab(n_vocab)).write_to(w)
    w.matrix("token_embd.weight", n_vocab, n_embd, std=1.0)
    w.add_tensor("position_embd.weight", w.rng.normal(0, 0.5, (n_ctx, n_embd)).astype(np.float32))
    w.vector("output_norm.weight", n_embd, 1.0)
    w.vector("output_norm.bias", n_embd)
    if not tied:
        w.add_tensor("output.weight", w.rng.normal(0, 0.2, (n_vocab, n_embd)).astype(np.float32))
    for i in range(n_layer):
        p = f"blk.{i}."
        for norm in ("attn_norm", "ffn_norm"):
            w.vector(p + norm + ".weight", n_embd, 1.0)
            w.vector(p + norm + ".bias", n_embd)
        for name, n_out, n_in in (("attn_qkv", 3 * n_embd, n_embd), ("attn_output", n_embd, n_embd),
                                  ("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff)):
            w.matrix(p + name + ".weight", n_out, n_in)
            w.vector(p + name + ".bias", n_out)
    _finish(w)
    return path


def write_starcoder2(path, n_vocab: int = 64, n_embd: int = 96, n_head: int = 6, n_head_kv: int = 2, n_ff: int = 192,
                     n_layer: int = 2, n_ctx: int = 128, tied: bool = True, fused_qkv: bool = False, qtype=None,
                     seed: int = 0, vocab: Vocab | None = None, output_std: float | None = None):
    """A StarCoder 2 file as the converter writes one (StarCoder2-15B's layout scaled down: GQA 3:1, NeoX RoPE
    over the whole head, tied output): LayerNorms with biases, q/k/v (fused_qkv: one attn_qkv with its bias) and
    attention output with biases, a GELU FFN (up, down) with biases."""
    hd = n_embd // n_head
    n_kv = n_head_kv * hd
    w = _Writer(path, "starcoder2", seed, qtype)
    w.hparams("starcoder2", context_length=n_ctx, embedding_length=n_embd, block_count=n_layer,
              feed_forward_length=n_ff, attention__head_count=n_head, attention__head_count_kv=n_head_kv,
              attention__layer_norm_epsilon=1e-5, rope__freq_base=100000.0, rope__dimension_count=hd)
    w.vocab_and_head(vocab, n_vocab, n_embd, tied, output_std)
    w.vector("output_norm.bias", n_embd)
    for i in range(n_layer):
        p = f"blk.{i}."
        for norm in ("attn_norm", "ffn_norm"):
            w.vector(p + norm + ".weight", n_embd, 1.0)
            w.vector(p + norm + ".bias", n_embd)
        attention = (("attn_qkv", n_embd + 2 * n_kv, n_embd),) if fused_qkv else (
            ("attn_q", n_embd, n_embd), ("attn_k", n_kv, n_embd), ("attn_v", n_kv, n_embd))
        for name, n_out, n_in in attention + (("attn_output", n_embd, n_embd), ("ffn_up", n_ff, n_embd),
                                              ("ffn_down", n_embd, n_ff)):
            w.matrix(p + name + ".weight", n_out, n_in)
            w.vector(p + name + ".bias", n_out)
    _finish(w)
    return path


POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # `<arch>.pooling_type` (llama.cpp's enum)


def write_bert(path, arch: str = "bert", n_vocab: int = 64, n_embd: int = 64, n_head: int = 4, n_ff: int = 128,
               n_layer: int = 2, n_ctx: int = 128, n_token_types: int = 2, pooling: str | None = "cls",
               qtype=None, seed: int = 0, vocab: Vocab | None = None, drop=(), classifier=None,
               keys: Mapping | None = None):
    """An encoder file as llama.cpp's converter writes it: `bert` (bge, MiniLM: learned positions, separate
    q/k/v, biases on every projection, GELU FFN) or `nomic-bert` (nomic-embed: RoPE NeoX with base 1000, fused
    qkv, SwiGLU FFN, no projection biases); both with token types, the embedding LayerNorm, post-LayerNorms
    with biases, `attention.causal` false and `pooling` as pooling_type (bge: cls; MiniLM, nomic: mean;
    None: no key); `drop` names keys or tensors to leave out; `classifier` (a list of labels, () for one
    unlabelled score as bge-reranker) adds a reranker's cls and cls.output heads (bert); `keys`: more `<arch>.`
    keys."""
    if arch not in ("bert", "nomic-bert"):
        raise GGMLError(f"write_bert writes bert and nomic-bert files, not {arch!r}")
    nomic = arch == "nomic-bert"
    w = _Writer(path, arch, seed, qtype, drop)
    w.hparams(arch, context_length=n_ctx, embedding_length=n_embd, block_count=n_layer, feed_forward_length=n_ff,
              attention__head_count=n_head, attention__layer_norm_epsilon=1e-12, attention__causal=False)
    if nomic:
        w.hparams(arch, rope__freq_base=1000.0)
    if pooling is not None:
        w.hparams(arch, pooling_type=POOLING_TYPES[pooling])
    w.hparams(arch, **(keys or {}))
    vocab = vocab.resized(n_vocab) if vocab else spm_vocab(n_vocab)
    count = {"tokenizer.ggml.token_type_count": (n_token_types, GGUFValueType.UINT32, None)}  # not a vocabulary's
    Vocab({**vocab.keys, **count}).write_to(w)
    w.matrix("token_embd.weight", n_vocab, n_embd, std=1.0)
    # F32 as the converters keep them: llama.cpp adds a token_types row as it is (no quantized add)
    w.add_tensor("token_types.weight", w.rng.normal(0, 0.5, (n_token_types, n_embd)).astype(np.float32))
    if not nomic:
        w.add_tensor("position_embd.weight", w.rng.normal(0, 0.5, (n_ctx, n_embd)).astype(np.float32))
    w.vector("token_embd_norm.weight", n_embd, 1.0)
    w.vector("token_embd_norm.bias", n_embd)
    if classifier is not None:
        w.classifier(arch, n_embd, classifier, dense=True)
    ffn = (("ffn_up", n_ff, n_embd), ("ffn_gate", n_ff, n_embd), ("ffn_down", n_embd, n_ff)) if nomic else \
        (("ffn_up", n_ff, n_embd), ("ffn_down", n_embd, n_ff))
    attn = (("attn_qkv", 3 * n_embd, n_embd),) if nomic else \
        (("attn_q", n_embd, n_embd), ("attn_k", n_embd, n_embd), ("attn_v", n_embd, n_embd))
    for i in range(n_layer):
        p = f"blk.{i}."
        for name, n_out, n_in in attn + (("attn_output", n_embd, n_embd),) + ffn:
            w.matrix(p + name + ".weight", n_out, n_in)
            if not nomic:
                w.vector(p + name + ".bias", n_out)
        for norm in ("attn_output_norm", "layer_output_norm"):
            w.vector(p + norm + ".weight", n_embd, 1.0)
            w.vector(p + norm + ".bias", n_embd)
    _finish(w)
    return path


def write_nomic_bert(path, **kw):
    """A nomic-bert file (see write_bert), mean pooling as nomic-embed-text."""
    kw.setdefault("pooling", "mean")
    return write_bert(path, "nomic-bert", **kw)


# ----- adapters -------------------------------------------------------------------------------------
LORA_TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down", "output")


def write_lora(path, base, rank: int = 4, alpha: float = 8.0, targets=LORA_TARGETS, seed: int = 0, qtype=None,
               std: float = 0.5) -> Path:
    """A LoRA adapter for the model file `base` as convert_lora_to_gguf.py writes one: general.type "adapter",
    adapter.type "lora", adapter.lora.alpha, and for each of base's matrices whose name has a part in `targets`
    `<name>.lora_a` (NumPy [rank, n_in]) and `<name>.lora_b` ([n_out, rank]), both random (B not zero as a
    freshly initialised adapter's, so that the adapter moves the logits); qtype: their type (None: F32)."""
    reader = GGUFReader(str(base))
    arch = reader.fields["general.architecture"].contents()
    w = _Writer(path, arch, seed, qtype)
    w.add_type("adapter")
    w.add_string("adapter.type", "lora")
    w.add_float32("adapter.lora.alpha", alpha)
    for t in reader.tensors:
        part = t.name.split(".")[-2] if t.name.startswith("blk.") else t.name.split(".")[0]
        if part in targets and t.name.endswith(".weight") and len(t.shape) == 2:
            n_in, n_out = (int(n) for n in t.shape)
            w.matrix(t.name + ".lora_a", rank, n_in, std=std / np.sqrt(n_in))
            w.matrix(t.name + ".lora_b", n_out, rank, std=std / np.sqrt(rank))
    _finish(w)
    return Path(path)


# ----- conversion -----------------------------------------------------------------------------------
def write_f32_copy(src, dst) -> None:
    """dst: src with every tensor dequantized to F32 and its keys kept (the yardstick llama.cpp is measured
    against: the same weights without the quantized products). Tensors are streamed, one at a time."""
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    w = GGUFWriter(str(dst), arch)
    for name, f in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type",
                                                  "general.quantization_version"):
            continue
        w.add_key_value(name, f.contents(), f.types[0], f.types[-1] if f.types[0] == GGUFValueType.ARRAY else None)
    w.add_file_type(LlamaFileType.ALL_F32)
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))   # NumPy order
        w.add_tensor_info(t.name, shape, np.dtype(np.float32), int(np.prod(shape)) * 4, QType.F32)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for t in reader.tensors:
        shape = tuple(int(n) for n in reversed(t.shape))
        w.write_tensor_data(dequantize(np.asarray(t.data), t.tensor_type).astype(np.float32).reshape(shape))
    w.close()


def _finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


# Real models' shapes for benchmarks on files of the sizes people download (random weights).
LLAMA_3_2_1B = dict(arch="llama", n_vocab=128256, n_embd=2048, n_head=32, n_head_kv=8, n_ff=8192, n_layer=16,
                    n_ctx=131072, tied=True, freq_base=500000.0)
LLAMA_3_1_8B = dict(arch="llama", n_vocab=128256, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_layer=32,
                    n_ctx=131072, tied=False, freq_base=500000.0)
# gpt-oss-20b's layers (24 of them; its vocabulary is 201088), its experts MXFP4 and the rest Q8_0 as released
GPT_OSS_20B = dict(n_embd=2880, n_head=64, n_head_kv=8, head_dim=64, n_ff_exp=2880, n_layer=24, n_expert=32,
                   n_expert_used=4, n_ctx=131072, sliding_window=128,
                   rope_scaling={"type": "yarn", "factor": 32.0, "original_context_length": 4096})
GPT_OSS_MIX = {"_exps": QType.MXFP4, "ffn_gate_inp": None, "*": QType.Q8_0}


def q4_k_m_mix(tied: bool) -> dict:
    """llama.cpp's Q4_K_M mix, simplified as most downloads have it: Q6_K for attn_v, ffn_down and the output
    (the token embedding when the output is tied to it), Q4_K elsewhere."""
    return {"attn_v": QType.Q6_K, "ffn_down": QType.Q6_K, "attn_output": QType.Q4_K, "output": QType.Q6_K,
            "token_embd": QType.Q6_K if tied else QType.Q4_K, "*": QType.Q4_K}


def write_llama_shaped(path, shape: Mapping, qtype, vocab: Vocab, seed: int = 0):
    """A llama of `shape` (LLAMA_3_2_1B, LLAMA_3_1_8B) in qtype (a type or a mix such as q4_k_m_mix), the rope
    frequency factors of Llama 3.2 (factor 32, tied) or 3.1 (8), and `vocab` padded to the shape's vocabulary."""
    factor = 32.0 if shape["tied"] else 8.0
    freqs = llama3_rope_freqs(shape["n_embd"] // shape["n_head"], shape["freq_base"], factor)
    return write_llama(path, qtype=qtype, vocab=vocab, seed=seed, rope_factors={"rope_freqs": freqs}, **shape)
