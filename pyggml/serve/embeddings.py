"""/v1/embeddings: pooled embeddings of the served model (a decoder's too, as llama-server's --embeddings),
computed on the engine's thread between its steps so they never race the batch."""

from __future__ import annotations

import asyncio
import base64

import numpy as np

from pyggml.errors import ParameterError
from pyggml.serve.completions import as_prompts, check_media
from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.state import ServerState

POOLING_TYPES = {1: "mean", 2: "cls", 3: "last"}  # llama.cpp's enum llama_pooling_type (0 none, 4 rank)
MAX_INPUTS = 2048  # as OpenAI


def default_pooling(model) -> str:
    """The file's pooling_type, or mean for a file without one (OpenAI's form needs one vector a text)."""
    return POOLING_TYPES.get(model.gguf.get(f"{model.architecture}.pooling_type"), "mean")


def read_inputs(f: Fields, n_vocab: int) -> list:
    """`input`: a string, token ids, llama-server's mixed array of strings and ids, its objects
    ({"prompt_string"} or {"content": [text parts]}), or an array of these; each item a string or a list."""
    value = f.get("input", (str, list, dict), required=True)
    value = as_prompts(value)
    if not value or len(value) > MAX_INPUTS:
        raise APIError(f"'input' must hold 1 to {MAX_INPUTS} items, got {len(value)}", param="input")
    return [_input(item, f"input[{i}]", n_vocab) for i, item in enumerate(value)]


def _input(item, where: str, n_vocab: int):
    if isinstance(item, dict):
        itf = Fields(item, where)
        if itf.has("prompt_string"):
            return itf.get("prompt_string", str)
        parts = itf.get("content", list, required=True)
        for j, part in enumerate(parts):
            kind = Fields(part, f"{where}.content[{j}]").get("type", str, required=True)
            check_media(kind, f"{where}.content[{j}]")
            if kind != "text":
                raise APIError(f"'{where}.content[{j}]' is a {kind!r} part; only text parts are read",
                               param=f"{where}.content[{j}]")
        return "".join(Fields(part, f"{where}.content[{j}]").get("text", str, required=True)
                       for j, part in enumerate(parts))
    ok = (isinstance(item, str) and item) or (isinstance(item, list) and item and
                                             all(_is_id(t) or isinstance(t, str) for t in item))
    if not ok:
        raise APIError(f"'{where}' must be a non-empty string or array of token ids and strings", param="input")
    if isinstance(item, list) and not all(0 <= t < n_vocab for t in item if _is_id(t)):
        raise APIError(f"'{where}' holds token ids outside the vocabulary of {n_vocab}", param="input")
    return item


def _is_id(t) -> bool:
    return isinstance(t, int) and not isinstance(t, bool)


async def embed(state: ServerState, body) -> dict:
    f = Fields(body)
    state.check_model_name(f.get("model", str))
    loaded = state.require()
    model = loaded.model
    inputs = read_inputs(f, model.n_vocab)
    fmt = f.get("encoding_format", str, "float", choices=("float", "base64"))
    dims = f.get("dimensions", int, None, low=1)
    if dims is not None and dims != model.arch.n_embd:
        raise APIError(f"'dimensions' {dims} is not supported: the model's embeddings have {model.arch.n_embd}",
                       param="dimensions")
    pooling = default_pooling(model)
    state.admit()
    outcome = "error"
    try:
        rows, n_tokens = await asyncio.wrap_future(loaded.engine.call(lambda m: _compute(m, inputs, pooling)))
        outcome = "completed"
    except ParameterError as e:
        raise APIError(str(e), param="input") from None
    finally:
        state.release(1, outcome)
    data = [{"object": "embedding", "index": i, "embedding": _encode(row, fmt)} for i, row in enumerate(rows)]
    return {"object": "list", "data": data, "model": loaded.model_id,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def _compute(model, inputs: list, pooling: str):
    ids = [_ids(model, x if isinstance(x, list) else [x]) for x in inputs]
    return np.asarray(model.embed(ids, pooling=pooling, normalize=2), dtype=np.float32), sum(map(len, ids))


def _ids(model, item: list) -> list[int]:
    """Token ids of an array of ids and strings (a string after the first element gets no BOS)."""
    out = []
    for x in item:
        out += model.tokenize(x, add_special=not out, parse_special=True) if isinstance(x, str) else [x]
    return out


def _encode(row: np.ndarray, fmt: str):
    return row.tolist() if fmt == "float" else base64.b64encode(row.astype("<f4").tobytes()).decode()
