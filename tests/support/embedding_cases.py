"""The random-weight models whose embeddings pyggml compares with llama.cpp's (`Llama(embedding=True).embed`):
the encoders (bert, nomic-bert; bge's WordPiece vocabulary, and SentencePiece) in every pooling, F32 and
quantized, and decoders pooled as llama.cpp's `--embeddings` pools them (llama, also with `attention.causal`
false, qwen2 with BPE, gemma3 with a sliding window shorter than a text, gpt2), and rerankers' scores ("rank":
a bert head cls + cls.output, one score or three labels; Qwen3-Reranker's "yes"/"no" softmax).

The references (data/llamacpp_embeddings.npz and .json, written by data/make_embedding_refs.py) hold each
case's tokens and raw embeddings and a digest of its file (parity_cases.sha256).
"""

from __future__ import annotations

import tarfile
import tempfile
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from pyggml.testing.synthetic import Vocab, write_bert, write_nomic_bert, write_qwen3

from tests.support.llama_cpp_vocabs import ARCHIVE, file_name
from tests.support.tiny_models import bpe_vocab, gemma3_vocab, write_gemma3, write_gpt2, write_llama

N_CTX = 128
TEXTS = ["Hello world", "The quick brown fox jumps over the lazy dog.",
         "Embeddings of random weights, compared token for token with llama.cpp: one, two, three, four, five.",
         "a"]
F32_COSINE = 1 - 1e-6   # the least cosine similarity of a row with F32 weights
COSINE = 0.9999         # with quantized weights (both sides multiply the same blocks)
F32_SCORE = 1e-4        # rank: the largest difference of a score, relative to the largest score's size
SCORE = 1e-2            # with quantized weights (as COSINE: a relative error of up to sqrt(2e-4))


@dataclass(frozen=True)
class EmbedCase:
    name: str
    write: object               # path -> path
    pooling: str
    from_file: bool = False     # embed with pooling=None: the file's pooling_type (or "none" without one)
    quantized: bool = False

    @property
    def min_cosine(self) -> float:
        return COSINE if self.quantized else F32_COSINE

    @property
    def score_tolerance(self) -> float:
        return SCORE if self.quantized else F32_SCORE


def _spm():
    return gemma3_vocab().resized(1024)


@cache
def bge_vocab() -> Vocab:
    """BAAI/bge-small's WordPiece vocabulary (30522 tokens; llama.cpp's models/ggml-vocab-bert-bge.gguf, kept in
    tests/models/data/llama_cpp_vocabs)."""
    with tarfile.open(ARCHIVE) as archive, tempfile.TemporaryDirectory() as tmp:
        archive.extract(file_name("bert-bge"), tmp, filter="data")
        return Vocab.from_gguf(Path(tmp) / file_name("bert-bge"))


_SIZES = dict(n_vocab=1024, n_embd=96, n_head=6, n_ff=160, n_ctx=N_CTX)
_ENCODER = dict(n_vocab=30522, n_embd=64, n_head=4, n_ff=128, n_ctx=N_CTX)


def _bert(seed, **kw):
    return lambda p: write_bert(p, **{**_ENCODER, "vocab": bge_vocab(), "seed": seed, **kw})


def _nomic(seed, **kw):
    return lambda p: write_nomic_bert(p, **{**_ENCODER, "vocab": bge_vocab(), "seed": seed, **kw})


def _llama(arch="llama", **kw):
    return lambda p: write_llama(p, arch, **{**_SIZES, "n_head_kv": 2, "vocab": _spm(), "seed": 34, **kw})


CASES = [
    EmbedCase("bert-f32-cls", _bert(30), "cls", from_file=True),
    EmbedCase("bert-f32-mean", _bert(30), "mean"),
    EmbedCase("bert-f32-last", _bert(30), "last"),
    EmbedCase("bert-f32-none", _bert(30), "none"),
    EmbedCase("bert-q8_0-mean", _bert(31, qtype=Q.Q8_0, pooling="mean"), "mean", from_file=True, quantized=True),
    EmbedCase("nomic-bert-f32-mean", _nomic(32), "mean", from_file=True),
    EmbedCase("nomic-bert-f32-none", _nomic(32), "none"),
    EmbedCase("nomic-bert-q4_0-cls-spm", _nomic(33, qtype=Q.Q4_0, vocab=_spm(), n_vocab=1024), "cls",
              quantized=True),
    EmbedCase("llama-f32-mean", _llama(), "mean"),
    EmbedCase("llama-f32-last", _llama(), "last"),
    EmbedCase("llama-f32-none", _llama(), "none", from_file=True),
    EmbedCase("llama-f32-noncausal-mean", _llama(keys={"attention__causal": False}, seed=38), "mean"),
    EmbedCase("qwen2-f32-bpe-cls", _llama("qwen2", vocab=bpe_vocab("qwen2"), n_vocab=459, seed=35), "cls"),
    EmbedCase("gemma3-f32-mean", partial(write_gemma3, vocab=_spm(), n_vocab=1024, n_ctx=N_CTX, sliding_window=8,
                                         seed=36), "mean"),
    EmbedCase("gpt2-f32-bpe-last", partial(write_gpt2, vocab=bpe_vocab("gpt-2"), n_vocab=459, n_ctx=N_CTX, seed=37),
              "last"),
]
CASES += [
    EmbedCase("bert-f32-rank", _bert(39, pooling="rank", classifier=()), "rank", from_file=True),
    EmbedCase("bert-q8_0-rank-labels", _bert(40, qtype=Q.Q8_0, classifier=("a", "b", "c")), "rank", quantized=True),
    EmbedCase("qwen3-f32-rank", partial(write_qwen3, vocab=bpe_vocab("qwen2"), n_vocab=459, n_ctx=N_CTX,
                                        classifier=("yes", "no"), seed=41), "rank", from_file=True),
    EmbedCase("qwen3-q8_0-rank", partial(write_qwen3, vocab=bpe_vocab("qwen2"), n_vocab=459, n_embd=128, n_ctx=N_CTX,
                                         qtype=Q.Q8_0, classifier=("yes", "no"), seed=42), "rank", quantized=True),
]
BY_NAME = {c.name: c for c in CASES}


def write_case(case: EmbedCase, directory: Path) -> Path:
    return case.write(Path(directory) / f"{case.name}.gguf")
