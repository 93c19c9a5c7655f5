"""An mmproj file loaded and ready to encode images: its weights on a backend (quantized ones kept in their block
formats, as every model here), one graph for an image of the encoder's size, planned once by a GraphAllocator."""

from __future__ import annotations

import numpy as np

from pyggml.backend import Backend, init_by_name, tensor_get, tensor_set
from pyggml.core import Context, GGMLType, Graph
from pyggml.errors import ImageError
from pyggml.models.gguf.gguf_file import GGUFFile
from pyggml.models.gguf.gguf_loader import load_weights
from pyggml.models.llm.runner import SingleBackend
from pyggml.models.vision.mmproj import read_hparams
from pyggml.models.vision.siglip import Siglip

GRAPH_SIZE = 8192


class VisionEncoder:
    """`encode(pixels)`: [n_tokens, n_out] embeddings of one normalised image (see preprocess.py), as llama.cpp's
    clip_image_batch_encode gives them."""

    def __init__(self, path, backend: str | Backend = "CPU", weights: str = "quantized", progress: bool | None = None,
                 flash_attn: bool = True):
        self.gguf = GGUFFile.open(path)
        try:
            self.hparams = read_hparams(self.gguf)
            self.backend = init_by_name(backend) if isinstance(backend, str) else backend
            self.weights = load_weights(self.gguf, self.backend, weights=weights, progress=progress)
            self.model = Siglip(self.hparams, self.weights, flash_attn)
            self.weights.check_all_asked()
            self.runner = SingleBackend(self.backend)
            self.graph, self.inp, self.out = self._build()
            self.runner.reserve(self.graph)
            self.runner.alloc_graph(self.graph)
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
    def n_embd_out(self) -> int:
        """The width of the embeddings: the language model's n_embd it was made for."""
        return self.model.n_out

    @property
    def n_tokens(self) -> int:
        return self.model.n_tokens

    @property
    def compute_buffer_size(self) -> int:
        return self.runner.buffer_size

    def _build(self):
        ctx, size = Context(no_alloc=True), self.hparams.image_size
        inp = ctx.new_tensor_4d(GGMLType.F32, size, size, 3, 1, "inp_raw").set_input()
        out = self.model.build(ctx, inp).set_output()
        graph = Graph(GRAPH_SIZE)
        graph.build_forward_expand(out)
        return graph, inp, out

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """pixels: float32 [3, size, size] (channel planes, rows top to bottom)."""
        size = self.hparams.image_size
        if pixels.shape != (3, size, size):
            raise ImageError(f"the encoder takes normalised images of shape (3, {size}, {size}), got {pixels.shape}")
        tensor_set(self.inp, np.ascontiguousarray(pixels, dtype=np.float32))
        self.runner.compute(self.graph)
        return np.asarray(tensor_get(self.out), dtype=np.float32).reshape(self.n_tokens, self.n_embd_out).copy()

    def close(self) -> None:
        self.gguf.close()
