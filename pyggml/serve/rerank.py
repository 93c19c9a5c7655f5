"""/v1/rerank, /rerank (and llama.cpp's /reranking aliases): documents scored against a query by a reranker file
(`rank` pooling: a classification head, arch/classifier.py), in llama.cpp's server's shapes. Each (query,
document) pair is one text, built as llama.cpp's format_prompt_rerank builds it: the file's
`tokenizer.chat_template.rerank` with {query} and {document} filled in (Qwen3-Reranker), else
[BOS] query [EOS] [SEP] document [EOS] with each special token where the vocabulary adds it. A pair's score is
its head's first output (bge: the raw logit; Qwen3: P(yes)). Jina's request (`documents`) gets
`{"results": [{"index", "relevance_score"}], "usage"}`; TEI's (`texts`) a bare list of `{"index", "score"}`
(with `"text"` when `return_text`). Results are sorted by score, best first, and cut to `top_n`."""

from __future__ import annotations

import asyncio

import numpy as np

from pyggml.errors import ParameterError
from pyggml.serve.protocol import APIError, Fields
from pyggml.serve.state import ServerState

RERANK_TEMPLATE = "tokenizer.chat_template.rerank"
SEP_BY_DEFAULT = ("jina-v1-en", "jina-v2-code", "roberta-bpe")  # BPE pre-tokenizers llama.cpp adds [SEP] for


async def rerank(state: ServerState, body):
    f = Fields(body)
    state.check_model_name(f.get("model", str))
    loaded = state.require()
    model = loaded.model
    if model.arch.classifier is None:
        raise APIError("this server's model is no reranker (it has no classification head, tensor "
                       "cls.output.weight); serve a reranker GGUF for /rerank", status=501,
                       kind="not_supported_error")
    tei = "texts" in f.body
    name = "texts" if tei else "documents"
    query = f.get("query", str, required=True)
    documents = f.get(name, list, [])
    if not documents or not all(isinstance(d, str) for d in documents):
        raise APIError(f"'{name}' must be a non-empty array of strings", param=name)
    top_n = f.get("top_n", int, len(documents), low=0)
    return_text = tei and f.get("return_text", bool, False)
    texts = [pair_tokens(model, query, d) for d in documents]
    state.admit()
    outcome = "error"
    try:
        scores = await asyncio.wrap_future(loaded.engine.call(lambda m: m.embed(texts, pooling="rank")))
        outcome = "completed"
    except ParameterError as e:
        raise APIError(str(e), param=name) from None
    finally:
        state.release(1, outcome)
    label = "score" if tei else "relevance_score"
    order = np.argsort(-scores[:, 0], kind="stable")[:top_n]
    results = [{"index": int(i), label: float(scores[i, 0]), **({"text": documents[i]} if return_text else {})}
               for i in order]
    if tei:
        return results
    n_tokens = sum(map(len, texts))
    return {"model": f.get("model", str, loaded.model_id), "object": "list", "results": results,
            "usage": {"prompt_tokens": n_tokens, "total_tokens": n_tokens}}


def pair_tokens(model, query: str, document: str) -> list[int]:
    """The tokens of one (query, document) pair, as llama.cpp's format_prompt_rerank makes them."""
    template = model.gguf.get(RERANK_TEMPLATE)
    if template is not None:
        text = template.replace("{query}", query).replace("{document}", document)
        return model.tokenize(text, add_special=False, parse_special=True)
    tok = model.tokenizer
    eos = tok.eos_id if tok.eos_id is not None else tok.sep_id
    ids = [tok.bos_id] if tok.add_bos else []
    ids += model.tokenize(query, add_special=False) + ([eos] if tok.add_eos else [])
    ids += [tok.sep_id] if adds_sep(model) else []
    ids += model.tokenize(document, add_special=False) + ([eos] if tok.add_eos else [])
    if any(t is None for t in ids):
        raise APIError("the reranker's vocabulary lacks the special tokens its pairs need (bos, eos or sep)",
                       status=500, kind="server_error")
    return ids


def adds_sep(model) -> bool:
    """llama.cpp's add_sep: the file's `tokenizer.ggml.add_sep_token`, else true for WordPiece vocabularies and
    a few BPE pre-tokenizers."""
    default = (model.gguf.get("tokenizer.ggml.model") == "bert"
               or model.gguf.get("tokenizer.ggml.pre") in SEP_BY_DEFAULT)
    return bool(model.gguf.get("tokenizer.ggml.add_sep_token", default))
