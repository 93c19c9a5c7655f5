"""The vision parity cases: a random-weight language model and mmproj pair per projector type, one image and a
prompt, written the same way (seeded) wherever they run, so llama.cpp's committed outputs stay valid."""

from __future__ import annotations

import hashlib
import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.testing.synthetic import write_gemma3, write_llama
from pyggml.testing.synthetic_vision import TINY_GEMMA3, TINY_IDEFICS3, vision_vocab, write_mmproj

N_CTX = 256
TEXT = "what is <__media__> in the image"


@dataclass(frozen=True)
class VisionCase:
    name: str
    projector: dict
    image_size: tuple  # (width, height) of the random image

    def write(self, folder: Path) -> tuple[Path, Path]:
        lm, mmproj = folder / f"{self.name}-lm.gguf", folder / f"{self.name}-mmproj.gguf"
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
         VisionCase("idefics3-f32-no-longest-edge", {**TINY_IDEFICS3, "longest_edge": 0}, (80, 60))]


def sha256(path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
