"""llama.cpp's teacher-forced logits through llama-cpp-python (an optional peer, imported on use): the
reference the parity tests and benchmarks/kld_vs_llamacpp.py measure pyggml against.

Flash attention stays off (llama-cpp-python's default, and the graph pyggml builds); the KV cache type
is chosen per run: F32 where F32 weights are compared to the 1e-6 bound, F16 as llama.cpp's default.
The CPU's extra buffer types (REPACK, AMX) stay off: the references then come from ggml's plain kernels,
the same on every x86 machine, and AMX, where a CPU reports it, crashed decoding quantized weights in
a container that does not grant the tile state.
"""

from __future__ import annotations

import collections
import os
import re
from contextlib import contextmanager

import numpy as np

from pyggml.errors import GGMLError

_GGML_TYPE = {"F32": 0, "F16": 1}


@contextmanager
def no_extra_buffer_types(bindings):
    """llama.cpp's model parameters with use_extra_bufts off (llama-cpp-python sets no such option itself;
    `bindings` is its ctypes module, where Llama takes the defaults from)."""
    default = bindings.llama_model_default_params

    def params():
        p = default()
        p.use_extra_bufts = False
        return p

    bindings.llama_model_default_params = params
    try:
        yield
    finally:
        bindings.llama_model_default_params = default


def buffer_types(log: str) -> str:
    """The buffer types llama.cpp's verbose load log names for the model's weights ("CPU_REPACK model buffer
    size = ...", "CPU_Mapped model buffer size = ...") and the repacked layouts it chose ("repack tensor ...
    with q4_K_8x8"), counted: which kernels the peer ran with."""
    sizes = dict(re.findall(r"(\w+) model buffer size\s*=\s*([\d.]+ MiB)", log))
    layouts = collections.Counter(re.findall(r"repack tensor .* with (\w+)", log))
    if not sizes:
        return "unknown (no verbose load log)"
    text = ", ".join(f"{name} {size}" for name, size in sizes.items())
    return text + (f"; repacked: {', '.join(f'{k} x{n}' for k, n in sorted(layouts.items()))}" if layouts else "")


class LlamaCpp:
    """One llama.cpp model and context, evaluated on whole sequences from an empty cache."""

    def __init__(self, path, n_ctx: int, n_batch: int = 512, n_threads: int = 2, kv_type: str = "F32",
                 lora: tuple | None = None):
        try:
            import llama_cpp
        except ImportError:
            raise GGMLError("llama.cpp's logits need llama-cpp-python: pip install llama-cpp-python") from None
        if kv_type not in _GGML_TYPE:
            raise GGMLError(f"kv_type must be one of {sorted(_GGML_TYPE)}, not {kv_type!r}")
        self.version = llama_cpp.__version__
        with no_extra_buffer_types(llama_cpp.llama_cpp):
            self.llm = llama_cpp.Llama(model_path=os.fspath(path), n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                       n_threads=n_threads, n_threads_batch=n_threads, logits_all=True,
                                       type_k=_GGML_TYPE[kv_type], type_v=_GGML_TYPE[kv_type], flash_attn=False,
                                       verbose=False, **_lora_args(lora))

    @property
    def n_vocab(self) -> int:
        return self.llm.n_vocab()

    def tokenize(self, text: str, add_bos: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=False)

    def logits(self, tokens) -> np.ndarray:
        """[len(tokens), n_vocab] float32: the logits at every position, the sequence fed from position 0."""
        self.llm.reset()
        self.llm.eval(list(map(int, tokens)))
        return np.array(self.llm.scores[:len(tokens)], dtype=np.float32)

    def close(self) -> None:
        self.llm.close()


def _lora_args(lora: tuple | None) -> dict:
    """Llama's arguments for one LoRA adapter (path, scale)."""
    return {} if lora is None else dict(lora_path=os.fspath(lora[0]), lora_scale=float(lora[1]))


def llamacpp_logits(path, tokens, n_threads: int = 2, kv_type: str = "F32", lora: tuple | None = None) -> np.ndarray:
    """llama.cpp's logits for one sequence (a context just long enough, one batch), with a LoRA adapter
    (path, scale) if given."""
    llm = LlamaCpp(path, n_ctx=max(len(tokens), 8), n_batch=max(len(tokens), 8), n_threads=n_threads, kv_type=kv_type,
                   lora=lora)
    try:
        return llm.logits(tokens)
    finally:
        llm.close()


POOLING_TYPES = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # llama.cpp's enum llama_pooling_type


def llamacpp_embeddings(path, texts: list[str], pooling: str, n_ctx: int = 128, n_threads: int = 2,
                        kv_type: str = "F32", normalize: bool = False) -> tuple[list[list[int]], list[np.ndarray]]:
    """llama.cpp's tokens and embeddings of each text through `Llama(embedding=True, pooling_type=...).embed`
    (raw, or with normalize L2-normalized): [n_embd] per text, or [n_tokens, n_embd] for "none" (one text per
    call there: llama-cpp-python 0.3.36 reads the per-token rows of a second text from the wrong offset), or
    for "rank" a reranker's n_cls_out scores (llama-cpp-python hands out n_embd values; the rest is not the
    text's)."""
    try:
        import llama_cpp
    except ImportError:
        raise GGMLError("llama.cpp's embeddings need llama-cpp-python: pip install llama-cpp-python") from None
    with no_extra_buffer_types(llama_cpp.llama_cpp):
        llm = llama_cpp.Llama(model_path=os.fspath(path), embedding=True, pooling_type=POOLING_TYPES[pooling],
                              n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, n_threads=n_threads,
                              n_threads_batch=n_threads, type_k=_GGML_TYPE[kv_type], type_v=_GGML_TYPE[kv_type],
                              flash_attn=False, verbose=False)
    try:
        tokens = [llm.tokenize(t.encode("utf-8")) for t in texts]
        kw = dict(normalize=normalize, truncate=False)  # a text longer than n_ctx raises instead of being cut
        rows = [llm.embed(t, **kw) for t in texts] if pooling == "none" else llm.embed(texts, **kw)
        if pooling == "rank":
            rows = [r[:llama_cpp.llama_model_n_cls_out(llm.model)] for r in rows]
        return tokens, [np.asarray(r, dtype=np.float32) for r in rows]
    finally:
        llm.close()
