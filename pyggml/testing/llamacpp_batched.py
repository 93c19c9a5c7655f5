"""llama.cpp with several sequences in one context, through llama-cpp-python's low-level API (an optional peer,
imported on use): llama_batch with sequence ids per token, n_seq_max sequences over a unified KV cache, and
the llama_memory_seq_* operations. The reference for pyggml's batched decoding (tests/models/test_kv_cells.py,
benchmarks/batched_vs_llamacpp.py). Flash attention stays off. The CPU's extra buffer types (CPU_REPACK's
interleaved kernels) are off for references, as in pyggml.testing.llamacpp, and on for speed
(`extra_bufts=True`: llama.cpp at its best; its AMX type needs a llama.cpp built without AMX on machines
that do not grant the tile state).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from pyggml.errors import GGMLError

_GGML_TYPE = {"F32": 0, "F16": 1}


def _bindings():
    try:
        import llama_cpp
    except ImportError:
        raise GGMLError("llama.cpp as a peer needs llama-cpp-python: pip install llama-cpp-python") from None
    return llama_cpp.llama_cpp


@ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
def _quiet(level, text, user_data):
    """llama.cpp's log lines dropped."""


class LlamaCppSequences:
    def __init__(self, path, n_ctx: int, n_batch: int, n_seq_max: int, n_threads: int = 2, kv_type: str = "F16",
                 quiet: bool = True, extra_bufts: bool = False):
        lib = self.lib = _bindings()
        if quiet:
            lib.llama_log_set(_quiet, None)
        lib.llama_backend_init()
        mparams = lib.llama_model_default_params()
        mparams.use_extra_bufts = extra_bufts
        self.model = lib.llama_model_load_from_file(os.fspath(path).encode(), mparams)
        if not self.model:
            raise GGMLError(f"llama.cpp could not load {path}")
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = n_ctx, n_batch, n_batch, n_seq_max
        cparams.n_threads = cparams.n_threads_batch = n_threads
        cparams.type_k = cparams.type_v = _GGML_TYPE[kv_type]
        cparams.flash_attn_type = lib.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.kv_unified = True
        self.ctx = lib.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise GGMLError("llama.cpp could not create the context")
        self.mem = lib.llama_get_memory(self.ctx)
        self.n_batch = n_batch
        self.batch = lib.llama_batch_init(n_batch, 0, n_seq_max)
        self.n_vocab = lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model))

    def decode(self, tokens, positions, seq_ids, logits) -> np.ndarray:
        """One llama_decode of at most n_batch tokens; the logits of the flagged tokens ([k, n_vocab])."""
        b, n = self.batch, len(tokens)
        if n > self.n_batch:
            raise GGMLError(f"{n} tokens exceed the batch of {self.n_batch}")
        for i, (t, p, ids, want) in enumerate(zip(tokens, positions, seq_ids, logits, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = int(t), int(p), len(ids), bool(want)
            for j, s in enumerate(ids):
                b.seq_id[i][j] = int(s)
        b.n_tokens = n
        status = self.lib.llama_decode(self.ctx, b)
        if status != 0:
            raise GGMLError(f"llama_decode returned {status}")
        rows = [i for i in range(n) if logits[i]]
        return np.array([np.ctypeslib.as_array(self.lib.llama_get_logits_ith(self.ctx, i), (self.n_vocab,))
                         for i in rows], dtype=np.float32).reshape(len(rows), self.n_vocab)

    def seq_rm(self, seq_id: int, p0: int, p1: int) -> bool:
        return bool(self.lib.llama_memory_seq_rm(self.mem, seq_id, p0, p1))

    def seq_cp(self, src: int, dst: int, p0: int, p1: int) -> None:
        self.lib.llama_memory_seq_cp(self.mem, src, dst, p0, p1)

    def seq_keep(self, seq_id: int) -> None:
        self.lib.llama_memory_seq_keep(self.mem, seq_id)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        self.lib.llama_memory_seq_add(self.mem, seq_id, p0, p1, delta)

    def seq_div(self, seq_id: int, p0: int, p1: int, d: int) -> None:
        self.lib.llama_memory_seq_div(self.mem, seq_id, p0, p1, d)

    def seq_pos_min(self, seq_id: int) -> int:
        return int(self.lib.llama_memory_seq_pos_min(self.mem, seq_id))

    def seq_pos_max(self, seq_id: int) -> int:
        return int(self.lib.llama_memory_seq_pos_max(self.mem, seq_id))

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.mem, True)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)
        self.lib.llama_model_free(self.model)
