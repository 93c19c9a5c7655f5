"""A prompt with images as llama.cpp's mtmd_tokenize lays it out: the text is cut at each media marker, every part
tokenized on its own (special tokens parsed, no BOS), each image replaced by its projector's own tokens around
the chunks of its embeddings, and BOS put first when the vocabulary adds one.

- idefics3: for each tile row by row `<fake_token_around_image><row_R_col_C>` and the tile's embeddings, "\\n"
  after every row but the last; then "\\n\\n" `<fake_token_around_image><global-img>`, the whole image's
  embeddings and `<fake_token_around_image>`.
- gemma3: `<start_of_image>`, the embeddings, `<end_of_image>`.
- qwen2.5vl_merger: `<|vision_start|>`, the embeddings (ImageRows: they keep their grid of columns and rows, which
  an M-RoPE language model's positions need), `<|vision_end|>`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from pyggml.errors import ImageError
from pyggml.models.vision.image_cache import EncodedImage, chunk_identity
from pyggml.models.vision.mmproj import QWEN25VL
from pyggml.models.vision.preprocess import Tiles

MEDIA_MARKER = "<__media__>"  # llama.cpp's mtmd_default_marker


class ImageRows(np.ndarray):
    """A chunk of an image's embedding rows [n, n_embd] that know the image they come from (`identity`: what their
    cells hold in a cached token list, see image_cache.chunk_identity) and, for an M-RoPE model, their grid
    (nx, ny): the tokens row by row (Batch.embeddings reads it). Views and copies keep the grid but not the
    identity: a part of the rows is not the image whose cells a later prompt may reuse."""

    grid: tuple | None = None
    identity: int | None = None

    def __array_finalize__(self, obj) -> None:
        self.grid = getattr(obj, "grid", None)


def image_rows(rows: np.ndarray, grid: tuple | None, identity: int | None = None) -> ImageRows:
    out = rows.view(ImageRows)
    out.grid = None if grid is None else tuple(int(n) for n in grid)
    out.identity = identity
    return out


@dataclass
class Prompt:
    """Chunks in order: lists of token ids and float32 [n, n_embd] arrays of image embeddings."""

    chunks: list = field(default_factory=list)

    def add_tokens(self, ids) -> None:
        if not len(ids):
            return
        if self.chunks and isinstance(self.chunks[-1], list):
            self.chunks[-1].extend(ids)
        else:
            self.chunks.append(list(ids))

    def __len__(self) -> int:
        """Positions the prompt takes (an image's embeddings one each)."""
        return sum(len(c) for c in self.chunks)

    @property
    def n_image_tokens(self) -> int:
        return sum(len(c) for c in self.chunks if isinstance(c, np.ndarray))

    def engine_prompt(self) -> tuple[list[int], list]:
        """(token ids with 0 where each image's rows go, [(position, rows)]): the engine's Request.prompt/images."""
        ids, images = [], []
        for c in self.chunks:
            if isinstance(c, list):
                ids += c
            else:
                images.append((len(ids), c))
                ids += [0] * len(c)
        return ids, images

    @property
    def text_tokens(self) -> list[int]:
        return [t for c in self.chunks if isinstance(c, list) for t in c]


def _piece_token(model, text: str) -> list[int]:
    """The one token whose text is `text` (mtmd's lookup_token), as the tokenizer reads it with specials."""
    ids = model.tokenize(text, add_special=False, parse_special=True)
    if len(ids) != 1:
        raise ImageError(f"the vocabulary has no single token {text!r} that this projector places around images")
    return ids


def _special(model, text: str) -> list[int]:
    return model.tokenize(text, add_special=False, parse_special=True)


def encode_tiles(encoder, tiles: Tiles, identity: bytes) -> EncodedImage:
    """Every tile of one image through the encoder, in the order add_image lays them out (idefics3's whole image
    last); the rows carry the image's identity (and Qwen2.5-VL's its grid)."""
    pixels = tiles.tiles + ([tiles.overview] if tiles.overview is not None else [])
    grid = tiles.grid if encoder.projector == QWEN25VL else None
    chunks = [image_rows(encoder.encode(p), grid, chunk_identity(identity, i, encoder.key))
              for i, p in enumerate(pixels)]
    return EncodedImage(chunks, tiles.grid)


def add_image(prompt: Prompt, model, projector: str, image: EncodedImage) -> None:
    """The image's tokens and embeddings, in the projector's layout (see the module docstring)."""
    if projector == "gemma3":
        prompt.add_tokens(_special(model, "<start_of_image>"))
        prompt.chunks.append(image.chunks[0])
        prompt.add_tokens(_special(model, "<end_of_image>"))
        return
    if projector == QWEN25VL:
        prompt.add_tokens(_special(model, "<|vision_start|>"))
        prompt.chunks.append(image.chunks[0])
        prompt.add_tokens(_special(model, "<|vision_end|>"))
        return
    cols, rows = image.grid
    for y in range(rows):
        for x in range(cols):
            prompt.add_tokens(_special(model, f"<fake_token_around_image><row_{y + 1}_col_{x + 1}>"))
            prompt.chunks.append(image.chunks[y * cols + x])
        if y != rows - 1:
            prompt.add_tokens(_piece_token(model, "\n"))
    prompt.add_tokens(_piece_token(model, "\n\n") + _piece_token(model, "<fake_token_around_image>")
                      + _piece_token(model, "<global-img>"))
    prompt.chunks.append(image.chunks[-1])
    prompt.add_tokens(_piece_token(model, "<fake_token_around_image>"))


def build_prompt(model, projector: str, text: str, images: list[EncodedImage], add_special: bool = True) -> Prompt:
    """`text` with one MEDIA_MARKER per image (markers are put first when the text has none)."""
    n_markers = text.count(MEDIA_MARKER)
    if n_markers == 0 and images:
        text, n_markers = MEDIA_MARKER * len(images) + text, len(images)
    if n_markers != len(images):
        raise ImageError(f"the prompt has {n_markers} image markers ({MEDIA_MARKER}) for {len(images)} images")
    prompt = Prompt()
    parts = text.split(MEDIA_MARKER)
    for i, part in enumerate(parts):
        prompt.add_tokens(_special(model, part) if part else [])
        if i < len(images):
            add_image(prompt, model, projector, images[i])
    tok = model.tokenizer
    if add_special and tok.add_bos:
        if prompt.chunks and isinstance(prompt.chunks[0], list):
            prompt.chunks[0].insert(0, tok.bos_id)
        else:
            prompt.chunks.insert(0, [tok.bos_id])
    if add_special and getattr(tok, "add_eos", False):
        prompt.add_tokens([tok.eos_id])
    return prompt
