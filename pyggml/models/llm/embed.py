"""Embeddings of texts (Model.embed), as llama.cpp computes them with `--embeddings`.

Each batch of whole texts is one graph of its own: the texts' tokens side by side, positions restarting at 0
for each text, and a mask that keeps every token within its own text (llama.cpp's sequences in one ubatch).
Encoders (bert) attend both ways; decoders causally (unless their file's `attention.causal` is false), over
the text's own tokens. No KV cache is read or written: the architecture's graph gets a NoCache, whose
"cache" is the step's own keys and values. The hidden states are the encoder's output, or a decoder's
output-norm rows that its output head would multiply (llama.cpp's t_embd); pooling them follows llama.cpp's
build_pooling: "mean" multiplies them by a [n_tokens, n_texts] matrix of 1/length, "cls" takes each text's
first row and "last" its last (get_rows), "none" keeps every token's row, and "rank" scores each text with a
reranker's classification head (arch/classifier.py) over its first row (its last when the model attends
causally, its mean when the file says so). The graphs are placed in a
compute buffer of their own, so the model's step graphs, their buffer and the KV cache are left as they were.
"""

from __future__ import annotations

from numbers import Integral

import numpy as np

from pyggml.backend import tensor_get, tensor_set
from pyggml.core import GGMLType, Op, Tensor
from pyggml.core import ops
from pyggml.errors import GGMLError, GGUFError, ParameterError
from pyggml.models.arch.blocks import Step
from pyggml.models.llm.runner import Scheduled, SingleBackend

POOLINGS = ("none", "mean", "cls", "last", "rank")
GGUF_POOLINGS = {0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}  # llama.cpp's enum llama_pooling_type


def file_pooling(gguf) -> str:
    """The file's `<arch>.pooling_type` by name; "none" when it has none (llama.cpp's default then)."""
    key = f"{gguf.architecture}.pooling_type"
    value = gguf.get(key)
    if value is None:
        return "none"
    if value not in GGUF_POOLINGS:
        raise GGUFError(f"{gguf.path}: metadata key '{key}' is {value!r}; expected one of {sorted(GGUF_POOLINGS)}")
    return GGUF_POOLINGS[value]


def check_pooling(pooling: str, arch) -> str:
    if pooling == "rank" and arch.classifier is None:
        raise ParameterError('pooling "rank" needs a reranker\'s classification head (tensor cls.output.weight), '
                             f"which this {type(arch).__name__} file does not have; pass one of "
                             f"{', '.join(POOLINGS[:-1])}")
    if pooling not in POOLINGS:
        raise ParameterError(f"unknown pooling {pooling!r}; expected one of {', '.join(POOLINGS)}")
    return pooling


def check_norm(norm: int) -> None:
    if isinstance(norm, bool) or not isinstance(norm, Integral) or norm < -1:
        raise ParameterError(f"normalize must be an integer >= -1 (-1 none, 0 max-abs, 1 taxicab, 2 euclidean, "
                             f">2 p-norm), got {norm!r}")


def normalize(rows: np.ndarray, norm: int) -> np.ndarray:
    """Each row divided by its norm, as llama.cpp's common_embd_normalize (`--embd-normalize`): -1 none,
    0 max-abs scaled to 32760 (an int16 range), 1 taxicab, 2 euclidean, p > 2 the p-norm; a row of norm 0
    stays 0."""
    check_norm(norm)
    x = np.asarray(rows, dtype=np.float64)
    if norm == -1:
        return np.asarray(rows, dtype=np.float32)
    if norm == 0:
        size = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    else:
        size = (np.abs(x) ** norm).sum(axis=-1, keepdims=True) ** (1.0 / norm)
    scale = np.divide(1.0, size, out=np.zeros_like(size), where=size > 0)
    return (x * scale).astype(np.float32)


def token_lists(model, texts) -> list[list[int]]:
    """Token ids per text: texts is a str, a list of token ids, or a list of str and token-id lists. Strings
    are tokenized as llama.cpp's embedding does (special tokens added, none parsed)."""
    if isinstance(texts, str) or (_is_ids(texts) and len(texts) > 0):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise ParameterError(f"embed: texts must be a str, a list of str or of token-id lists, got {texts!r:.80}")
    lists = []
    for i, text in enumerate(texts):
        if isinstance(text, str):
            if not text:
                raise ParameterError(f"embed: text {i} is empty")
            ids = model.tokenize(text)
        elif _is_ids(text):
            ids = [int(t) for t in text]
            bad = next((t for t in ids if not 0 <= t < model.n_vocab), None)
            if bad is not None:
                raise ParameterError(f"embed: text {i} has token id {bad}, outside the vocabulary [0, {model.n_vocab})")
        else:
            raise ParameterError(f"embed: text {i} is neither a str nor a list of token ids: {text!r:.80}")
        if not ids:
            raise ParameterError(f"embed: text {i} has no tokens")
        lists.append(ids)
    return lists


def _is_ids(value) -> bool:
    if isinstance(value, np.ndarray):
        return value.ndim == 1 and np.issubdtype(value.dtype, np.integer)
    return isinstance(value, (list, tuple)) and all(isinstance(t, Integral) and not isinstance(t, bool) for t in value)


def batches(lengths: list[int], n_batch: int) -> list[list[int]]:
    """Consecutive texts grouped while their tokens fit n_batch (a longer text goes alone)."""
    groups, total = [], 0
    for i, n in enumerate(lengths):
        if groups and total + n <= n_batch:
            groups[-1].append(i)
            total += n
        else:
            groups.append([i])
            total = n
    return groups


def sequence_mask(seq: np.ndarray, pos: np.ndarray, causal: bool, window: int | None) -> np.ndarray:
    """[n_tokens, n_tokens] of 0 where query i1 sees key i0 and -inf elsewhere (llama.cpp's mask without a KV
    cache): the same text, not later when causal, and within a sliding window of keys when one is given."""
    q_seq, k_seq, q_pos, k_pos = seq[:, None], seq[None, :], pos[:, None], pos[None, :]
    visible = q_seq == k_seq
    if causal:
        visible &= k_pos <= q_pos
    if window is not None:
        visible &= q_pos - k_pos < window
    return np.where(visible, np.float32(0), np.float32(-np.inf)).astype(np.float32)


class NoCache:
    """What `attention()` takes for a KV cache: each layer attends to the step's own keys and values."""

    flash_attn = False  # attended with mul_mat + soft_max, as llama.cpp's embeddings without -fa

    def store(self, step, il: int, k: Tensor, v: Tensor) -> None:
        self.k, self.v = k, v

    def views(self, ctx, il: int, n_kv: int) -> tuple[Tensor, Tensor]:
        """K as [head_dim, n_tokens, n_head_kv] and Vᵀ as [n_tokens, head_dim, n_head_kv], as the cache's views."""
        return (ops.cont(ctx, ops.permute(ctx, self.k, 0, 2, 1, 3)),
                ops.cont(ctx, ops.permute(ctx, self.v, 1, 2, 0, 3)))

    @staticmethod
    def rotate_k(ctx, x: Tensor) -> Tensor:
        """Nothing is quantized, so nothing is rotated (KVCache.rotate_k)."""
        return x

    rotate_v = rotate_k


def head_input(logits: Tensor, head: Tensor) -> Tensor:
    """A decoder's t_embd: the rows its output head multiplies (llama.cpp's "result_norm"), found below the logits."""
    todo, seen = [logits], set()
    while todo:
        t = todo.pop(0)
        if t.op == Op.MUL_MAT and t.src[0] is head:
            return t.src[1]
        seen.add(id(t))
        todo.extend(s for s in t.srcs if id(s) not in seen)
    raise GGMLError("embed: the decoder's graph has no output-head product to take the hidden states from")


def pool(step: Step, hidden: Tensor, pooling: str, n_texts: int) -> tuple[Tensor, Tensor | None]:
    """The pooled rows ([n_embd, n_texts], or [n_embd, n_tokens] for "none") and the pooling's input tensor."""
    ctx = step.ctx
    if pooling == "none":
        return hidden, None
    if pooling == "mean":
        weights = ctx.new_tensor_2d(GGMLType.F32, step.n_tokens, n_texts, "inp_mean").set_input()
        return ops.mul_mat(ctx, ops.cont(ctx, ops.transpose(ctx, hidden)), weights), weights
    rows = ctx.new_tensor_1d(GGMLType.I32, n_texts, "inp_cls").set_input()
    return ops.get_rows(ctx, hidden, rows), rows


def pooling_input(pooling: str, lengths: list[int]) -> np.ndarray:
    """The values of pool()'s input: 1/length over each text's columns (mean), or each text's first or last
    row (cls, last)."""
    starts = np.cumsum([0] + lengths[:-1])
    if pooling == "mean":
        weights = np.zeros((len(lengths), sum(lengths)), np.float32)
        for i, (s, n) in enumerate(zip(starts, lengths, strict=True)):
            weights[i, s:s + n] = 1.0 / n
        return weights
    return (starts if pooling == "cls" else starts + np.asarray(lengths) - 1).astype(np.int32)


class Embedder:
    """A model's embedding graphs and their compute buffer (an encoder's runner is the model's own: it has no
    step graphs; a decoder's is a new one of the same kind, so generation keeps its buffer and plans)."""

    def __init__(self, model):
        self.model = model
        # decoders attend causally unless the file says otherwise (llama.cpp's `attention.causal`, e.g. gte-Qwen2)
        self.causal = not model.arch.encoder and model.gguf.get(f"{model.architecture}.attention.causal", True)
        if model.kv is None:
            self.runner = model.runner
        elif isinstance(model.runner, Scheduled):
            self.runner = Scheduled(model.runner.sched.backends, model.runner.placement)
        else:
            self.runner = SingleBackend(model.backend)

    def embed(self, texts, pooling: str | None, norm: int) -> np.ndarray | list[np.ndarray]:
        model = self.model
        pooling = check_pooling(file_pooling(model.gguf) if pooling is None else pooling, model.arch)
        check_norm(norm)
        ids = token_lists(model, texts)
        learned = getattr(model.arch, "pos_embd", None) is not None  # bert, gpt2: one learned row per position
        limit = min(model.n_ctx, model.arch.n_ctx_train) if learned else model.n_ctx
        for i, t in enumerate(ids):
            if len(t) > limit:
                what = "the model's learned positions" if limit < model.n_ctx else "n_ctx"
                raise ParameterError(f"embed: text {i} has {len(t)} tokens, more than the context of {limit} ({what})")
        rows = []
        for group in batches([len(t) for t in ids], model.n_batch):
            rows.append(self.run([ids[i] for i in group], pooling))
        rows = np.concatenate(rows)
        if pooling == "rank":  # scores, as llama.cpp's rerank hands them out: not normalized
            return rows
        if pooling != "none":
            return normalize(rows, norm)
        ends = np.cumsum([len(t) for t in ids])
        return [normalize(r, norm) for r in np.split(rows, ends[:-1])]

    def run(self, texts: list[list[int]], pooling: str) -> np.ndarray:
        """One graph over these texts: their pooled rows [n_texts, n_embd] (every token's for "none"; "rank":
        their scores [n_texts, n_cls_out])."""
        arch, lengths = self.model.arch, [len(t) for t in texts]
        n = sum(lengths)
        step = Step.new(n, n, n, n_ctx=self.model.n_ctx, loras=self.model.loras.active(), n_pos=arch.n_pos_per_token)
        out = arch.build(step, NoCache())
        hidden = out if arch.encoder else head_input(out, arch.output)
        head = arch.classifier if pooling == "rank" else None
        if head is not None:  # llama.cpp's rank pooling: the rows the head reads (build_inp_cls / build_inp_mean)
            pooling = "mean" if head.pool_mean else "last" if self.causal else "cls"
        pooled, pool_in = pool(step, hidden, pooling, len(texts))
        if head is not None:
            pooled = head.scores(step.ctx, pooled)
        pooled.set_output()
        step.graph.build_forward_expand(pooled)
        self.runner.alloc_graph(step.graph)
        seq = np.repeat(np.arange(len(texts)), lengths)
        pos = np.concatenate([np.arange(k) for k in lengths]).astype(np.int32)
        tensor_set(step.tokens, np.concatenate(texts).astype(np.int32))
        tensor_set(step.positions, np.tile(pos, arch.n_pos_per_token))  # text: every M-RoPE stream alike
        for window, mask in step.masks.items():
            tensor_set(mask, sequence_mask(seq, pos, self.causal, window))
        if pool_in is not None:
            tensor_set(pool_in, pooling_input(pooling, lengths))
        self.runner.compute(step.graph)
        return np.asarray(tensor_get(pooled), dtype=np.float32).reshape(-1, pooled.ne[0])
