"""Random-weight LoRA adapters on parity-case models (parity_cases.py), compared with llama.cpp's logits for the
same adapter at the same scale (data/llamacpp_lora.npz and .json, written by data/make_llamacpp_refs.py lora)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType as Q

from pyggml.testing.synthetic import LORA_TARGETS, write_lora

from tests.support.parity_cases import BY_NAME, write_case


@dataclass(frozen=True)
class LoraCase:
    name: str
    base: str                      # a parity case's name
    scale: float
    rank: int = 8
    alpha: float = 16.0
    targets: tuple = LORA_TARGETS
    qtype: object = None           # the adapter's type (convert_lora_to_gguf.py writes F16 by default)
    seed: int = 0

    def write(self, directory: Path) -> tuple[Path, Path]:
        """(model, adapter) files in directory."""
        base = write_case(BY_NAME[self.base], directory)
        adapter = write_lora(Path(directory) / f"{self.name}.lora.gguf", base, rank=self.rank, alpha=self.alpha,
                             targets=self.targets, seed=self.seed, qtype=self.qtype)
        return base, adapter

    def tokens(self) -> list[int]:
        return BY_NAME[self.base].tokens()


LORA_CASES = [
    LoraCase("llama-f32-spm+lora", "llama-f32-spm", scale=1.0, seed=1),
    LoraCase("qwen3-f32-bpe+lora-f16-half", "qwen3-f32-bpe", scale=0.5, rank=4, alpha=32.0, qtype=Q.F16, seed=2),
    LoraCase("gemma2-f32-spm+lora-attn", "gemma2-f32-spm", scale=2.0, rank=2, alpha=0.0,
             targets=("attn_q", "attn_v", "attn_output"), seed=3),
]
LORA_BY_NAME = {c.name: c for c in LORA_CASES}
