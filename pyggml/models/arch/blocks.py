"""Graph pieces every decoder architecture shares: the per-step inputs, norms, attention over the KV cache, FFNs.

Each function adds ggml ops to one step's context, in the order llama.cpp's graph builders use,
so that the graphs (and so the numbers) stay comparable with llama.cpp's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from pyggml.core import Context, GGMLType, Graph, Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError

ROPE_NORMAL = 0
ROPE_NEOX = 2


@dataclass
class Step:
    """One forward graph: its context, graph, sizes and input tensors (filled by the model after allocation).

    Cells [0, n_kv) of the KV cache are attended (n_kv >= the cells in use, padded like llama.cpp so that
    consecutive steps have the same shapes; the mask hides the extra cells). Nothing in the graph depends
    on the tokens' positions: they, the mask and the KV cells written are inputs, so one Step serves every
    step of the same shape. `out_ids` selects the rows whose logits are computed (None: every row).
    """

    ctx: Context
    graph: Graph
    n_tokens: int
    n_outputs: int
    n_kv: int
    tokens: Tensor
    positions: Tensor
    out_ids: Tensor | None
    masks: dict = field(default_factory=dict)  # window (None = full causal) -> F32 [n_kv, n_tokens] input
    kv_cells: tuple | None = None              # I64 inputs: the KV cache rows this step writes (kv_cache.store)
    n_ctx: int = 0
    loras: tuple = ()                          # (adapter, scale) pairs that layers.lora_mm adds to projections
    embd: Tensor | None = None                 # F32 [n_embd, n_tokens] input rows in place of tokens (images)

    @classmethod
    def new(cls, n_tokens: int, n_outputs: int, n_kv: int, graph_size: int = 8192, n_ctx: int = 0,
            loras: tuple = (), n_embd: int = 0, n_pos: int = 1) -> Step:
        """n_embd > 0: a step over embeddings given as input (llama_batch.embd) instead of token ids; n_pos:
        positions per token (4 for M-RoPE: the streams one after another, as llama.cpp's inp_pos)."""
        ctx = Context(no_alloc=True)
        tokens = ctx.new_tensor_1d(GGMLType.I32, n_tokens, "inp_tokens").set_input()
        positions = ctx.new_tensor_1d(GGMLType.I32, n_tokens * n_pos, "inp_pos").set_input()
        out_ids = None
        if n_outputs < n_tokens:
            out_ids = ctx.new_tensor_1d(GGMLType.I32, n_outputs, "inp_out_ids").set_input()
        embd = ctx.new_tensor_2d(GGMLType.F32, n_embd, n_tokens, "inp_embd").set_input() if n_embd else None
        return cls(ctx, Graph(graph_size), n_tokens, n_outputs, n_kv, tokens, positions, out_ids, n_ctx=n_ctx,
                   loras=tuple(loras), embd=embd)

    def input_embeddings(self, tok_embd: Tensor) -> Tensor:
        """The step's input rows: its embeddings input, else the token embeddings' rows (llama.cpp's
        build_inp_embd)."""
        return self.embd if self.embd is not None else ops.get_rows(self.ctx, tok_embd, self.tokens)

    def mask(self, window: int | None = None) -> Tensor:
        """The attention mask input for a layer with this sliding window (one tensor per distinct window)."""
        if window not in self.masks:
            name = "kq_mask" if window is None else f"kq_mask_swa{window}"
            self.masks[window] = self.ctx.new_tensor_2d(GGMLType.F32, self.n_kv, self.n_tokens, name).set_input()
        return self.masks[window]

    def select_outputs(self, *tensors: Tensor) -> list[Tensor]:
        """Keep only the rows that need logits (llama.cpp's inp_out_ids on the last layer)."""
        if self.out_ids is None:
            return list(tensors)
        return [ops.get_rows(self.ctx, t, self.out_ids) for t in tensors]


def rms_norm(ctx: Context, x: Tensor, weight: Tensor, eps: float) -> Tensor:
    return ops.mul(ctx, ops.rms_norm(ctx, x, eps), weight)


def layer_norm(ctx: Context, x: Tensor, weight: Tensor, bias: Tensor | None, eps: float) -> Tensor:
    x = ops.mul(ctx, ops.norm(ctx, x, eps), weight)
    return ops.add(ctx, x, bias) if bias is not None else x


def linear(ctx: Context, w: Tensor, x: Tensor, bias: Tensor | None = None) -> Tensor:
    y = ops.mul_mat(ctx, w, x)
    return ops.add(ctx, y, bias) if bias is not None else y


ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
N_CTX_PAD = 256  # llama.cpp rounds the context up to this (llama-context.cpp) before comparing it with n_ctx_orig


@dataclass(frozen=True)
class Rope:
    """ggml_rope_ext's parameters for one layer, as llama.cpp derives them from the file (see `from_gguf`).

    Frequency factors divide each pair's frequency: Llama 3.1's `rope_freqs.weight` (`freq_factors`), else
    LongRoPE's `short_factors` or, for a context longer than n_ctx_orig, its `long_factors`.
    """

    n_dims: int
    mode: int
    freq_base: float
    freq_scale: float = 1.0
    n_ctx_orig: int = 0
    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    freq_factors: Tensor | None = None
    short_factors: Tensor | None = None
    long_factors: Tensor | None = None

    @classmethod
    def from_gguf(cls, gguf, w, n_dims: int, mode: int, freq_base: float | None = None,
                  freq_scale: float | None = None) -> Rope:
        """llama.cpp's RoPE of a file (llama-model.cpp load_hparams, llama-context.cpp): `rope.scaling.type`
        none / linear (the default) / yarn / longrope; freq_scale = 1 / `rope.scaling.factor` (1 when the type
        is none or there is no factor); n_ctx_orig = `rope.scaling.original_context_length` or the training
        context. YaRN sets ext_factor 1 and attn_factor = mscale(factor) / (1 + 0.1 ln factor) (the second
        term cancels the magnitude ggml's kernel applies itself), times `rope.scaling.attn_factor`; beta_fast
        and beta_slow stay 32 and 1, as llama.cpp keeps them for the architectures built here. Frequency
        factors: `rope_freqs.weight`, `rope_factors_short.weight`, `rope_factors_long.weight`.
        `freq_base` / `freq_scale` override the file's (a sliding-window layer's own base and scale)."""
        kind = gguf.get(f"{gguf.architecture}.rope.scaling.type", "linear")
        if kind not in ROPE_SCALING_TYPES:
            raise GGUFError(f"{gguf.path}: metadata key '{gguf.architecture}.rope.scaling.type' is {kind!r}; "
                            f"expected one of {', '.join(ROPE_SCALING_TYPES)}")
        factor = hparam(gguf, "rope.scaling.factor", 0.0) or hparam(gguf, "rope.scale_linear", 0.0)
        file_scale = 1.0 if kind == "none" or factor == 0 else 1.0 / factor
        attn_factor, ext_factor = hparam(gguf, "rope.scaling.attn_factor", 1.0), 0.0
        if kind == "yarn":  # the context's ext_factor and attn_factor, the same for every layer
            ext_factor, factor = 1.0, 1.0 / file_scale
            mscale = 1.0 if factor <= 1.0 else 0.1 * math.log(factor) + 1.0
            attn_factor *= mscale / (1.0 + 0.1 * math.log(factor))
        pairs = (n_dims // 2,)
        n_ctx_orig = hparam(gguf, "rope.scaling.original_context_length", 0) or hparam(gguf, "context_length")
        return cls(n_dims, mode, hparam(gguf, "rope.freq_base", 10000.0) if freq_base is None else freq_base,
                   file_scale if freq_scale is None else freq_scale, n_ctx_orig, ext_factor, attn_factor,
                   freq_factors=w.optional("rope_freqs.weight", pairs),
                   short_factors=w.optional("rope_factors_short.weight", pairs),
                   long_factors=w.optional("rope_factors_long.weight", pairs))

    def factors_for(self, n_ctx: int) -> Tensor | None:
        """llama.cpp's get_rope_factors: rope_freqs, else LongRoPE's set for the context's length (as llama.cpp
        pads it: a multiple of N_CTX_PAD)."""
        if self.freq_factors is not None:
            return self.freq_factors
        n_ctx_seq = -(-n_ctx // N_CTX_PAD) * N_CTX_PAD
        return self.long_factors if n_ctx_seq > self.n_ctx_orig else self.short_factors

    def apply(self, step: Step, x: Tensor) -> Tensor:
        return self.rotate(step.ctx, x, step.positions, step.n_ctx)

    def rotate(self, ctx: Context, x: Tensor, positions: Tensor, n_ctx: int) -> Tensor:
        """x rotated by `positions` (also by position deltas: the KV cache's shift of cached keys)."""
        return ops.rope_ext(ctx, x, positions, self.factors_for(n_ctx), self.n_dims, self.mode, self.n_ctx_orig,
                            self.freq_base, self.freq_scale, self.ext_factor, self.attn_factor, self.beta_fast,
                            self.beta_slow)


def attention(step: Step, kv, il: int, q: Tensor, k: Tensor, v: Tensor, kq_scale: float,
              window: int | None = None, sinks: Tensor | None = None, softcap: float = 0.0) -> Tensor:
    """Store k, v for this step in the cache and attend q over cells [0, n_kv): softmax(scale·qkᵀ + mask)·v,
    qkᵀ capped to softcap·tanh(qkᵀ / softcap) first if softcap is set (Gemma 2's attention logit soft-capping),
    the softmax's sum taking each head's sink logit too if sinks are given (gpt-oss).

    q is [head_dim, n_head, n_tokens], k and v [head_dim, n_head_kv, n_tokens]; the result is
    [head_dim·n_head, n_tokens]. Query head h reads KV head h // (n_head / n_head_kv) (mul_mat broadcasting).
    `sinks` (F32 [n_head], gpt-oss) are logits of one more key per head that joins each softmax's
    denominator and reads no value.
    """
    ctx = step.ctx
    q, k, v = kv.rotate_k(ctx, q), kv.rotate_k(ctx, k), kv.rotate_v(ctx, v)  # a quantized cache's rotation
    kv.store(step, il, k, v)
    k_all, v_all = kv.views(ctx, il, step.n_kv)
    q = ops.permute(ctx, q, 0, 2, 1, 3)                       # [head_dim, n_tokens, n_head]
    if kv.flash_attn:                                         # llama.cpp's flash attention path (-fa)
        out = ops.flash_attn_ext(ctx, q, k_all, v_all, ops.cast(ctx, step.mask(window), GGMLType.F16), kq_scale,
                                 0.0, softcap)                # [head_dim_v, n_head, n_tokens]
        ops.flash_attn_ext_add_sinks(out, sinks)
        out.set_name(f"__fattn__-{il}")
        return kv.rotate_v(ctx, ops.reshape_2d(ctx, out, out.ne[0] * out.ne[1], step.n_tokens))
    kq = ops.mul_mat(ctx, k_all, q).set_name(f"kq-{il}")     # [n_kv, n_tokens, n_head]
    if softcap:
        kq = soft_cap(ctx, kq, softcap)
    kq = ops.soft_max_ext(ctx, kq, step.mask(window), kq_scale, 0.0).set_name(f"kq_soft_max-{il}")
    if sinks is not None:
        ops.soft_max_add_sinks(kq, sinks)
    kqv = ops.mul_mat(ctx, v_all, kq)                         # [head_dim, n_tokens, n_head]
    out = ops.permute(ctx, kqv, 0, 2, 1, 3)                   # [head_dim, n_head, n_tokens]
    return kv.rotate_v(ctx, ops.cont_2d(ctx, out, q.ne[0] * q.ne[2], step.n_tokens).set_name(f"kqv_out-{il}"))


def soft_cap(ctx: Context, x: Tensor, cap: float) -> Tensor:
    """cap·tanh(x / cap), as llama.cpp builds it (scale, tanh, scale)."""
    return ops.scale(ctx, ops.tanh(ctx, ops.scale(ctx, x, 1.0 / cap)), cap)


def default_kq_scale(head_dim: int) -> float:
    return 1.0 / math.sqrt(head_dim)


_REQUIRED = object()


def hparam(gguf, key: str, default=_REQUIRED):
    """`<architecture>.<key>` from the GGUF metadata; GGUFError names the key when a required one is missing."""
    full = f"{gguf.architecture}.{key}"
    value = gguf.require(full) if default is _REQUIRED else gguf.get(full, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise GGUFError(f"{gguf.path}: metadata key '{full}' is {value!r}; expected a number >= 0")
    return value


MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS


def check_count(gguf, key: str, n, limit: int | None = None, what: str = "a positive integer") -> None:
    """Sizes, layer counts and divisors must be positive integers (a float, 0 or 2**40 would fail far from the
    file, as a TypeError, a ZeroDivisionError or an allocation of terabytes)."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1 or (limit is not None and n > limit):
        bound = f" at most {limit}" if limit is not None else ""
        raise GGUFError(f"{gguf.path}: metadata key '{gguf.architecture}.{key}' is {n!r}; expected {what}{bound}")


def hparam_count(gguf, key: str, default=_REQUIRED, limit: int | None = None) -> int:
    """`<architecture>.<key>` that must be a positive integer (at most `limit`)."""
    value = hparam(gguf, key, default)
    check_count(gguf, key, value, limit)
    return value


def hparam_per_layer(gguf, key: str, n_layer: int, default=_REQUIRED) -> list:
    """`<architecture>.<key>` for each layer: one number for all, or an array of one per layer (llama.cpp's
    get_key_or_arr)."""
    full = f"{gguf.architecture}.{key}"
    value = gguf.get(full)
    if value is None or isinstance(value, (int, float)):
        return [hparam(gguf, key, default)] * n_layer
    values = list(value.tolist() if hasattr(value, "tolist") else value)
    if len(values) != n_layer or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in values):
        raise GGUFError(f"{gguf.path}: metadata key '{full}' is {values!r}; expected {n_layer} integers >= 0")
    return values


def swa_layers(gguf, n_layer: int, n_pattern: int, dense_first: bool = False) -> list[bool]:
    """Which layers use the sliding window (llama.cpp's load_swa_pattern): `attention.sliding_window_pattern`
    as one bool per layer, or a period n (default n_pattern): layer il is SWA unless il % n == n - 1
    (dense_first: unless il % n == 0); a period of 0 makes every layer SWA."""
    full = f"{gguf.architecture}.attention.sliding_window_pattern"
    value = gguf.get(full, n_pattern)
    if not isinstance(value, int):
        flags = list(value.tolist() if hasattr(value, "tolist") else value)
        if len(flags) != n_layer or not all(isinstance(f, bool) for f in flags):
            raise GGUFError(f"{gguf.path}: metadata key '{full}' is {flags!r}; expected {n_layer} booleans")
        return flags
    n = hparam(gguf, "attention.sliding_window_pattern", n_pattern)
    if dense_first:
        return [n == 0 or il % n != 0 for il in range(n_layer)]
    return [n == 0 or il % n < n - 1 for il in range(n_layer)]


class Decoder:
    """What every architecture reads the same way, in the two phases every architecture has: `read_hparams`
    (sizes from `<arch>.*` keys) and `declare` (the embeddings, the output head: output.weight as `OUTPUT`
    says, and each layer's tensors); then `build` adds one step's graph. Subclasses extend each phase
    (calling super() first) and set class attributes where llama.cpp's builders differ. Encoders (bert) set
    `encoder`: they have no output head and no KV cache, and attend both ways."""

    encoder = False
    classifier = None   # a reranker's head (arch/classifier.py), for Model.embed's "rank" pooling
    OUTPUT = "optional"  # output.weight: "optional" (tied to the embeddings when absent), "required" or "tied"
    takes_embeddings = False  # whose graphs read Step.embd (image rows) in place of token embeddings
    n_pos_per_token = 1       # positions per token in Step.positions (M-RoPE's 4 streams: qwen2vl)

    def __init__(self, gguf, w):
        self.read_hparams(gguf)
        self.declare(gguf, w)

    def read_hparams(self, gguf) -> None:
        self.n_layer = hparam_count(gguf, "block_count", limit=MAX_LAYERS)
        self.n_embd = hparam_count(gguf, "embedding_length")
        self.n_ff_arr = hparam_per_layer(gguf, "feed_forward_length", self.n_layer)
        self.n_ff = self.n_ff_arr[0]
        self.n_head = self.uniform(gguf, "attention.head_count", hparam_per_layer(gguf, "attention.head_count",
                                                                                 self.n_layer))
        self.n_head_kv = self.uniform(gguf, "attention.head_count_kv", hparam_per_layer(
            gguf, "attention.head_count_kv", self.n_layer, self.n_head))
        for key, n in (("attention.head_count", self.n_head), ("attention.head_count_kv", self.n_head_kv)):
            check_count(gguf, key, n)
        self.head_dim = hparam(gguf, "attention.key_length", self.n_embd // self.n_head)
        check_count(gguf, "attention.key_length" if f"{gguf.architecture}.attention.key_length" in gguf.metadata
                    else "attention.head_count", self.head_dim, what="a head size of at least 1")
        self.n_ctx_train = hparam(gguf, "context_length")
        self.n_embd_k_gqa = self.n_embd_v_gqa = self.head_dim * self.n_head_kv

    def declare(self, gguf, w) -> None:
        self.tok_embd = w.get("token_embd.weight", (self.n_embd, None))
        self.n_vocab = self.tok_embd.ne[1]
        if not self.encoder:
            self.output_norm = w.get("output_norm.weight", (self.n_embd,))
            self.output = self.output_matrix(w)

    def output_matrix(self, w) -> Tensor:
        """output.weight, or the token embeddings when the file ties them (an architecture that always ties
        does not look output.weight up, so a file holding one is refused as llama.cpp refuses it)."""
        if self.OUTPUT == "tied":
            return self.tok_embd
        if self.OUTPUT == "required":
            return w.get("output.weight", (self.n_embd, self.n_vocab))
        return w.optional("output.weight", (self.n_embd, self.n_vocab)) or self.tok_embd

    @property
    def shiftable(self) -> bool:
        """Whether cached keys can move to new positions by a RoPE rotation (seq_add, seq_div): only where the
        architecture says which RoPE each layer's keys took (overrides layer_rope); the others refuse a shift
        rather than leave keys at their old positions."""
        return type(self).layer_rope is not Decoder.layer_rope

    def layer_rope(self, il: int) -> Rope | None:
        """The RoPE applied to layer il's q and keys (None: none, its cached keys do not depend on position)."""
        return None

    def rope_qk(self, step: Step, il: int, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q and k rotated by layer il's RoPE (as they are where it has none)."""
        rope = self.layer_rope(il)
        return (q, k) if rope is None else (rope.apply(step, q), rope.apply(step, k))

    def norm_qk(self, step: Step, il: int, layer, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """q and k before RoPE ([head_dim, heads, n_tokens]); architectures with q/k norms normalize them here."""
        return q, k

    @staticmethod
    def uniform(gguf, key: str, values: list):
        """The one value of a per-layer array (the KV cache and the graphs take one head count for all layers)."""
        if len(set(values)) > 1:
            raise GGUFError(f"{gguf.path}: metadata key '{gguf.architecture}.{key}' differs between layers "
                            f"({values}); pyggml's {gguf.architecture} takes one value for every layer")
        return values[0]
