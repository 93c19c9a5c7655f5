"""The vision parity cases: a random-weight language model and mmproj pair per projector type, one image and a
prompt, written the same way (seeded) wherever they run, so llama.cpp's committed outputs stay valid."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.models.vision.mmproj import QWEN25VL
from pyggml.testing.synthetic import write_gemma3, write_llama, write_qwen2vl
from pyggml.testing.synthetic_vision import (QWEN_IMAGE_TOKENS, TINY_GEMMA3, TINY_IDEFICS3, TINY_QWEN25VL,
                                             vision_vocab, write_mmproj, write_qwen25vl_mmproj)

N_CTX = 256
TEXT = "what is <__media__> in the image"


@dataclass(frozen=True)
class VisionCase:
    name: str
    projector: dict
    image_size: tuple  # (width, height) of the random image
    # the embeddings' bound on max |pyggml - llama.cpp| / max |llama.cpp|. ggml's GELU reads an F16 table (pyggml's
    # is ggml's entry for entry): a GELU input that float32 rounding (llama.cpp's sums and pyggml's in another order,
    # a few ulps apart) moves across an F16 rounding boundary takes the neighbouring entry, a 2^-11 relative step.
    # Given llama.cpp's GELU inputs every case agrees within 1e-6 (test_mtmd_parity.py); without them each
    # projector type's case is within 1e-5 (Qwen2.5-VL's merger, a GELU then one product, at 9.9e-6 on an Intel Xeon
    # and an AMD EPYC alike), and one tile of idefics3 without preproc_image_size (8 steps) reaches 3.6e-5: that
    # case alone is held to 1e-4
    embd_rtol: float = 1e-5

    def write(self, folder: Path) -> tuple[Path, Path]:
        lm, mmproj = folder / f"{self.name}-lm.gguf", folder / f"{self.name}-mmproj.gguf"
        if self.projector["projector"] == QWEN25VL:
            write_qwen2vl(lm, vocab=vision_vocab(QWEN_IMAGE_TOKENS), n_ctx=N_CTX, seed=1)
            write_qwen25vl_mmproj(mmproj, **{k: v for k, v in self.projector.items() if k != "projector"}, seed=2)
            return lm, mmproj
        if self.projector["projector"] == "gemma3":
            write_gemma3(lm, vocab=vision_vocab(), n_ctx=N_CTX, n_layer=2, seed=1)
        else:
            write_llama(lm, vocab=vision_vocab(), n_ctx=N_CTX, seed=1)
        write_mmproj(mmproj, **self.projector, seed=2)
        return lm, mmproj

    def image(self) -> bytes:
        """A PNG of random pixels over a smooth gradient (resampling then has something to keep)."""
        from PIL import Image

        w, h = self.image_size
        rng = np.random.default_rng(3)
        ramp = np.linspace(0, 200, w)[None, :, None] + np.linspace(0, 50, h)[:, None, None]
        pixels = np.clip(ramp + rng.integers(0, 56, (h, w, 3)), 0, 255).astype(np.uint8)
        out = io.BytesIO()
        Image.fromarray(pixels).save(out, format="PNG")
        return out.getvalue()


CASES = [VisionCase("idefics3-f32", TINY_IDEFICS3, (80, 60)), VisionCase("gemma3-f32", TINY_GEMMA3, (40, 30)),
         VisionCase("idefics3-f32-no-longest-edge", {**TINY_IDEFICS3, "longest_edge": 0}, (80, 60), embd_rtol=1e-4),
         # resized to 140 x 112 (5 x 4 tokens: two attention windows across), then text at M-RoPE positions
         VisionCase("qwen25vl-f32", {"projector": QWEN25VL, **TINY_QWEN25VL}, (150, 100))]


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def counting_encodes(model, monkeypatch) -> list:
    """The tiles the model's encoder runs on from now on (one entry each)."""
    runs = []
    monkeypatch.setattr(model.vision, "encode", lambda pixels, run=model.vision.encode: runs.append(1) or run(pixels))
    return runs
