"""An mmproj file loaded and ready to encode images: its weights on a backend (quantized ones kept in their block
formats, as every model here), one graph for an image of the encoder's size, planned once by a GraphAllocator
(Qwen2.5-VL takes images of any size: a graph is built for each new size, the last one kept). The images it encoded
last are kept by content (image_cache), so a resent image costs no encoding."""

from __future__ import annotations

import os

import numpy as np

from pyggml.backend import Backend, init_by_name, tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph
from pyggml.errors import ImageError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.gguf.gguf_loader import load_weights
from pyggml.models.llm.runner import SingleBackend
from pyggml.models.vision.image_cache import DEFAULT_CACHE_BYTES, EncodedImage, ImageCache, image_identity
from pyggml.models.vision.mmproj import QWEN25VL, read_hparams
from pyggml.models.vision.preprocess import decode_image, preprocess, read_image
from pyggml.models.vision.prompt import encode_tiles
from pyggml.models.vision.qwen25vl import Qwen25VL
from pyggml.models.vision.siglip import Siglip

GRAPH_SIZE = 8192


class VisionEncoder:
    """`encode(pixels)`: [n_tokens, n_out] embeddings of one normalised image (see preprocess.py), as llama.cpp's
    clip_image_batch_encode gives them; `encode_image(image)`: every chunk of an image file's, from `cache` when
    the same image was encoded lately (at most `cache_bytes` of embeddings are kept)."""

    def __init__(self, path, backend: str | Backend = "CPU", weights: str = "quantized", progress: bool | None = None,
                 flash_attn: bool = True, cache_bytes: int = DEFAULT_CACHE_BYTES):
        self.cache = ImageCache(cache_bytes)
        self.key = os.urandom(8)  # in its images' cell identities: a cell another encoder filled is never reused
        self.gguf = GGUFFile.open(path)
        try:
            self.hparams = read_hparams(self.gguf)
            self.backend = init_by_name(backend) if isinstance(backend, str) else backend
            self.weights = load_weights(self.gguf, self.backend, weights=weights, progress=progress)
            encoder = Qwen25VL if self.hparams.projector == QWEN25VL else Siglip
            self.model = encoder(self.hparams, self.weights, flash_attn)
            self.weights.check_all_asked()
            self.runner = SingleBackend(self.backend)
            self.size = None  # (width, height) of the graph built last
            if not self.dynamic_size:
                self._graph_for(self.hparams.image_size, self.hparams.image_size)
        except BaseException:
            self.gguf.close()
            raise

    @property
    def projector(self) -> str:
        return self.hparams.projector

    @property
    def causal(self) -> bool:
        """Whether the language model reads the image's embeddings causally (mtmd_decode_use_non_causal: not
        Gemma 3's)."""
        return self.projector != "gemma3"

    @property
    def dynamic_size(self) -> bool:
        """Whether images keep their own size (Qwen2.5-VL) instead of the encoder's image_size square."""
        return self.projector == QWEN25VL

    @property
    def n_embd_out(self) -> int:
        """The width of the embeddings: the language model's n_embd it was made for."""
        return self.model.n_out

    @property
    def n_tokens(self) -> int:
        """Embeddings one image gives (the fixed-size projectors')."""
        return self.model.n_tokens

    @property
    def compute_buffer_size(self) -> int:
        return self.runner.buffer_size

    def _graph_for(self, width: int, height: int) -> None:
        """Build, plan and place the graph for images of width x height pixels (unless the last one was)."""
        if self.size == (width, height):
            return
        if self.size is not None:
            self.runner.forget(self.graph)
        ctx = Context(no_alloc=True)
        self.inp = ctx.new_tensor_4d(GGMLType.F32, width, height, 3, 1, "inp_raw").set_input()
        self.out = self.model.build(ctx, self.inp).set_output()
        self.graph = Graph(GRAPH_SIZE)
        self.graph.build_forward_expand(self.out)
        self.ctx, self.size = ctx, (width, height)
        self.runner.reserve(self.graph)
        self.runner.alloc_graph(self.graph)

    def _check_shape(self, shape: tuple) -> None:
        if not self.dynamic_size:
            size = self.hparams.image_size
            if shape != (3, size, size):
                raise ImageError(f"the encoder takes normalised images of shape (3, {size}, {size}), got {shape}")
            return
        block = 2 * self.hparams.patch_size
        if len(shape) != 3 or shape[0] != 3 or shape[1] % block or shape[2] % block or min(shape[1:]) < block:
            raise ImageError(f"the encoder takes normalised images of shape (3, height, width), both sides positive "
                             f"multiples of {block}, got {shape}")

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """pixels: float32 [3, size, size] (channel planes, rows top to bottom; [3, height, width] for Qwen2.5-VL);
        [n_tokens, n_embd_out] embeddings."""
        self._check_shape(pixels.shape)
        height, width = pixels.shape[1:]
        self._graph_for(width, height)
        tensor_set(self.inp, np.ascontiguousarray(pixels, dtype=np.float32))
        if self.dynamic_size:
            for tensor, values in self.model.input_values(width, height).items():
                tensor_set(tensor, values)
        self.runner.compute(self.graph)
        return np.asarray(tensor_get(self.out), dtype=np.float32).reshape(-1, self.n_embd_out).copy()

    def encode_image(self, source) -> EncodedImage:
        """An image (bytes, a path or a Pillow image) decoded, cut into tiles and encoded; ImageError for a bad one."""
        data = read_image(source)
        identity = image_identity(data)
        image = self.cache.get(identity)
        if image is None:
            image = encode_tiles(self, preprocess(decode_image(data), self.hparams), identity)
            self.cache.put(identity, image)
        return image

    def close(self) -> None:
        self.gguf.close()
