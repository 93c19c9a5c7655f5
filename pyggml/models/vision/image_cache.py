"""Encoded images kept by content. OpenAI clients send the whole conversation every turn, its images included, and
`pyggml chat` renders the history anew each turn: the same image comes back again and again. Its identity is the
SHA-256 of its file's bytes, as llama.cpp's mtmd_helper_bitmap_init_from_buf names a bitmap (a hash a crafted
image cannot collide with another's); its embeddings are kept by it in a small LRU bounded by bytes, so a resent
image is not decoded, resized nor run through the encoder again, and every chunk's rows carry a number derived
from it, which the KV cache's prefix reuse compares (pyggml.models.llm.cached_prefix)."""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from pyggml.errors import ParameterError

DEFAULT_CACHE_BYTES = 64 << 20  # a few images' embeddings (Gemma 3 4B: 2.5 MiB an image; Qwen2.5-VL 7B at 1 Mpx: 19)


def image_identity(source) -> bytes:
    """The SHA-256 of an encoded image's bytes, or of a Pillow image's mode, size and pixels."""
    if isinstance(source, (bytes, bytearray, memoryview)):
        return hashlib.sha256(source).digest()
    h = hashlib.sha256(f"{source.mode} {source.width}x{source.height} ".encode())
    h.update(source.tobytes())
    return h.digest()


def chunk_identity(identity: bytes, index: int, encoder_key: bytes) -> int:
    """The number the cells of an image's index-th chunk of rows hold in a cached sequence's token list: negative
    (tokens are >= 0; -1 is kept for rows of no known image), 62 bits of a hash of the image's identity, the
    chunk's index and the encoder's key (another encoder's embeddings of the same image are other cells)."""
    digest = hashlib.sha256(identity + index.to_bytes(4, "little") + encoder_key).digest()
    return -2 - (int.from_bytes(digest[:8], "little") >> 2)


@dataclass
class EncodedImage:
    """One image's embeddings: its chunks of rows in the order the projector encodes them (idefics3: the tiles row
    by row, then the whole image), each an ImageRows with its identity; the grid its tiles were cut from."""

    chunks: list
    grid: tuple

    @property
    def nbytes(self) -> int:
        return sum(c.nbytes for c in self.chunks)


class ImageCache:
    """The encoded images seen last, by identity, least recently used dropped first to stay within max_bytes (an
    image larger than that is not kept). The rows are shared by every prompt that holds the image: read-only."""

    def __init__(self, max_bytes: int = DEFAULT_CACHE_BYTES):
        if not isinstance(max_bytes, int) or max_bytes < 0:
            raise ParameterError(f"the image cache's size must be a number of bytes >= 0 (0: none), got {max_bytes!r}")
        self.max_bytes = max_bytes
        self.nbytes = 0
        self._images: OrderedDict[bytes, EncodedImage] = OrderedDict()

    def __len__(self) -> int:
        return len(self._images)

    def get(self, identity: bytes) -> EncodedImage | None:
        image = self._images.get(identity)
        if image is not None:
            self._images.move_to_end(identity)
        return image

    def put(self, identity: bytes, image: EncodedImage) -> None:
        if identity in self._images or image.nbytes > self.max_bytes:
            return
        for chunk in image.chunks:
            chunk.flags.writeable = False
        self._images[identity] = image
        self.nbytes += image.nbytes
        while self.nbytes > self.max_bytes:
            self.nbytes -= self._images.popitem(last=False)[1].nbytes
