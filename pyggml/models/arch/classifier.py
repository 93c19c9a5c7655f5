"""A reranker's classification head (llama.cpp's cls, cls_out and build_pooling's LLAMA_POOLING_TYPE_RANK).

Rank pooling takes one row per text (the first, or the last when the model attends causally; the mean when the
file's `classifier.pooling_type` is mean) and scores it: bert rerankers (bge-reranker and other
sequence-classification heads) multiply by `cls.weight` [n_embd, n_embd] (+ `cls.bias`), take tanh, then
`cls.output.weight` [n_embd, n_cls_out] (+ `cls.output.bias`); Qwen3-Reranker files hold only
`cls.output.weight`, the output head's rows of "yes" and "no" (labels ["yes", "no"]), and take the softmax of
the two, so that the first score is P(yes). n_cls_out is the number of `classifier.output_labels` (1 without).
"""

from __future__ import annotations

from dataclasses import dataclass

from pyggml.core import Context, Tensor
from pyggml.core import ops
from pyggml.errors import GGUFError
from pyggml.models.arch.blocks import linear

POOLING_MEAN = 1  # llama.cpp's LLAMA_POOLING_TYPE_MEAN as `classifier.pooling_type`


@dataclass
class Classifier:
    labels: list[str]
    n_out: int
    dense: Tensor | None       # cls.weight: the pooler's dense layer (bert), tanh after it
    dense_b: Tensor | None
    out: Tensor                # cls.output.weight: the scores
    out_b: Tensor | None
    softmax: bool              # qwen3: the scores as probabilities
    pool_mean: bool            # pool by the mean instead of one row

    @classmethod
    def load(cls, gguf, w, n_embd: int, dense: bool, softmax: bool) -> Classifier | None:
        """The file's head, or None without cls.output.weight (a file holding only cls.weight loads, as in
        llama.cpp, but has no scores to rank by). dense: whether the architecture takes cls.weight/bias (bert)
        besides cls.output.weight/bias (bert; qwen3 takes no biases)."""
        key = f"{gguf.architecture}.classifier.output_labels"
        labels = gguf.get(key, [])
        labels = list(labels.tolist() if hasattr(labels, "tolist") else labels)
        if not all(isinstance(label, str) for label in labels):
            raise GGUFError(f"{gguf.path}: metadata key '{key}' is {labels!r:.80}; expected a list of strings")
        n_out = len(labels) or 1
        head = cls(labels, n_out,
                   dense=w.optional("cls.weight", (n_embd, n_embd)) if dense else None,
                   dense_b=w.optional("cls.bias", (n_embd,)) if dense else None,
                   out=w.optional("cls.output.weight", (n_embd, n_out)),
                   out_b=w.optional("cls.output.bias", (n_out,)) if dense else None,
                   softmax=softmax,
                   pool_mean=gguf.get(f"{gguf.architecture}.classifier.pooling_type") == POOLING_MEAN)
        return head if head.out is not None else None

    def scores(self, ctx: Context, pooled: Tensor) -> Tensor:
        """[n_out, n_texts] scores of the pooled rows [n_embd, n_texts]."""
        cur = pooled
        if self.dense is not None:
            cur = ops.tanh(ctx, linear(ctx, self.dense, cur, self.dense_b))
        cur = linear(ctx, self.out, cur, self.out_b)
        return ops.soft_max(ctx, cur) if self.softmax else cur
