"""llama.cpp's multimodal run through llama-cpp-python's libmtmd bindings (an optional peer, imported on use): the
prompt's chunks as mtmd_tokenize lays them out, each image chunk's embeddings (mtmd_encode_chunk), and the
teacher-forced logits of the text after the last image, every chunk before it evaluated by
mtmd_helper_eval_chunk_single. Flash attention is off in the encoder and the language model, the KV cache is F32
and the CPU's extra buffer types are off, as in pyggml.testing.llamacpp. On request, the inputs of every GELU of
the encoder's graphs too (read through mtmd's cb_eval), which the parity checks use to tell the F16-table GELU's
steps apart from the rest of the difference.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np

from pyggml.core.types import GGMLType
from pyggml.errors import GGMLError
from pyggml.testing.llamacpp import no_extra_buffer_types

FLASH_ATTN_DISABLED = 0  # llama_flash_attn_type
CHUNK_TEXT = 0           # mtmd_input_chunk_type


class _GGMLTensor(ctypes.Structure):
    """The head of ggml.h's struct ggml_tensor, up to its name (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64,
    GGML_MAX_SRC 10, GGML_MAX_NAME 64)."""

    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


class GeluInputs:
    """mtmd's cb_eval: clip.cpp names a GELU "ffn_gelu[-il]" and the tensor it reads "ffn_up[_b][-il]"; the last
    such input before each GELU is kept (a contiguous F32 copy, read before the GELU may overwrite it in place).
    `encodes`: one list per encoder graph run from next_encode() on, its GELUs' inputs in order, until finish()
    (mtmd_helper_eval_chunk_single encodes each image again)."""

    def __init__(self, bindings):
        self.encodes: list[list[np.ndarray]] = []
        self.recording = False
        self.pending: tuple[int, np.ndarray] | None = None
        self.callback = bindings.ggml_backend_sched_eval_callback(self._seen)

    def next_encode(self) -> None:
        self.encodes.append([])
        self.recording = True

    def finish(self) -> None:
        self.recording = False

    def _seen(self, pointer, ask: bool, _user) -> bool:
        t = _GGMLTensor.from_address(pointer)
        name = t.name.decode()
        if ask:
            return self.recording and name.startswith(("ffn_up", "ffn_gelu"))
        if name.startswith("ffn_up"):
            if t.type != GGMLType.F32 or t.nb[0] != 4:
                raise GGMLError(f"mtmd's {name} is not contiguous F32")
            count = int(np.prod(list(t.ne)))
            self.pending = pointer, np.ctypeslib.as_array((ctypes.c_float * count).from_address(t.data)).copy()
        elif name.startswith("ffn_gelu"):
            if self.pending is None or t.src[0] != self.pending[0]:
                raise GGMLError(f"mtmd's {name} does not read the ffn_up tensor before it")
            self.encodes[-1].append(self.pending[1])
        return True


def mtmd_reference(lm_path, mmproj_path, text: str, images: list[bytes], n_ctx: int = 512,
                   n_threads: int = 2, gelu_inputs: bool = False) -> dict:
    """{"layout": int32 [n] (token ids, -1 where an image's embedding goes), "embeddings": float32
    [n_image_tokens, n_embd], "logits": float32 [n_last_text, n_vocab] of the last text chunk's tokens}; with
    gelu_inputs, "gelu_inputs" too: per image chunk encoded, the float32 inputs of its GELUs in graph order."""
    try:
        import llama_cpp
        from llama_cpp import mtmd_cpp as mtmd
    except ImportError:
        raise GGMLError("llama.cpp's mtmd needs llama-cpp-python: pip install llama-cpp-python") from None
    with no_extra_buffer_types(llama_cpp.llama_cpp):
        llm = llama_cpp.Llama(model_path=os.fspath(lm_path), n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx,
                              n_threads=n_threads, n_threads_batch=n_threads, logits_all=True, type_k=0, type_v=0,
                              flash_attn=False, verbose=False)
    params = mtmd.mtmd_context_params_default()
    params.use_gpu, params.n_threads, params.print_timings = False, n_threads, False
    params.flash_attn_type, params.warmup = FLASH_ATTN_DISABLED, False
    gelu = GeluInputs(llama_cpp) if gelu_inputs else None
    if gelu is not None:
        params.cb_eval = gelu.callback
    ctx = mtmd.mtmd_init_from_file(os.fspath(mmproj_path).encode(), llm.model, params)
    if not ctx:
        raise GGMLError(f"mtmd could not load {mmproj_path}")
    try:
        out = _run(llm, mtmd, ctx, text, images, n_ctx, gelu)
        return out if gelu is None else out | {"gelu_inputs": gelu.encodes}
    finally:
        mtmd.mtmd_free(ctx)
        llm.close()


def _run(llm, mtmd, ctx, text: str, images: list[bytes], n_batch: int, gelu: GeluInputs | None) -> dict:
    bufs = [(ctypes.c_uint8 * len(b)).from_buffer_copy(b) for b in images]
    bitmaps = [mtmd.mtmd_helper_bitmap_init_from_buf(ctx, buf, len(buf), False) for buf in bufs]
    chunks = mtmd.mtmd_input_chunks_init()
    encoded = text.encode()
    inp = mtmd.mtmd_input_text(encoded, len(encoded), True, True)
    array = (mtmd.mtmd_bitmap_p_ctypes * len(bitmaps))(*bitmaps)
    if mtmd.mtmd_tokenize(ctx, chunks, ctypes.byref(inp), array, len(bitmaps)) != 0:
        raise GGMLError("mtmd_tokenize failed")
    layout, embeddings, last_text = [], [], []
    n = mtmd.mtmd_input_chunks_size(chunks)
    n_embd = llm.n_embd()
    for i in range(n):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_input_chunk_get_type(chunk) == CHUNK_TEXT:
            count = ctypes.c_size_t()
            ptr = mtmd.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            last_text = [ptr[j] for j in range(count.value)]
            layout += last_text
            continue
        n_tok = mtmd.mtmd_input_chunk_get_n_tokens(chunk)
        if gelu is not None:
            gelu.next_encode()
        if mtmd.mtmd_encode_chunk(ctx, chunk) != 0:
            raise GGMLError("mtmd_encode_chunk failed")
        out = mtmd.mtmd_get_output_embd(ctx)
        embeddings.append(np.ctypeslib.as_array(out, shape=(n_tok * n_embd,)).reshape(n_tok, n_embd).copy())
        layout += [-1] * n_tok
    if gelu is not None:
        gelu.finish()
    n_past = ctypes.c_int32(0)
    for i in range(n - 1):
        chunk = mtmd.mtmd_input_chunks_get(chunks, i)
        if mtmd.mtmd_helper_eval_chunk_single(ctx, llm.ctx, chunk, n_past.value, 0, n_batch, False,
                                              ctypes.byref(n_past)) != 0:
            raise GGMLError("mtmd_helper_eval_chunk_single failed")
    llm.n_tokens = n_past.value
    llm.eval(last_text)
    logits = np.array(llm.scores[n_past.value:n_past.value + len(last_text)], dtype=np.float32)
    for b in bitmaps:
        mtmd.mtmd_bitmap_free(b)
    mtmd.mtmd_input_chunks_free(chunks)
    return {"layout": np.asarray(layout, np.int32), "embeddings": np.concatenate(embeddings).astype(np.float32),
            "logits": logits}
