"""The models tests' random GGUF files (pyggml.testing.synthetic's writers) and the real vocabularies kept
in tests/models/data: byte-level BPE ones per pre-tokenizer and the first tokens of Gemma 3's SentencePiece list."""

from pathlib import Path

from pyggml.testing.synthetic import (Vocab, write_gemma2, write_gemma3, write_gpt2, write_granite, write_llama,
                                      write_phi3, write_qwen3, write_smollm3)

DATA = Path(__file__).resolve().parents[1] / "models" / "data"

__all__ = ["bpe_vocab", "gemma3_vocab", "write_gemma2", "write_gemma3", "write_gpt2", "write_granite", "write_llama",
           "write_phi3", "write_qwen3", "write_smollm3"]


def bpe_vocab(pre: str = "gpt-2") -> Vocab:
    """A byte-level BPE vocabulary for one of llama.cpp's pre-tokenizers (tests/models/data/bpe_vocabs)."""
    return Vocab.from_gguf(DATA / "bpe_vocabs" / f"{pre}.gguf")


def gemma3_vocab() -> Vocab:
    """Gemma 3's first 2048 SentencePiece tokens: specials, the 256 byte pieces and common pieces."""
    return Vocab.from_gguf(DATA / "spm_vocabs" / "gemma3.gguf")
