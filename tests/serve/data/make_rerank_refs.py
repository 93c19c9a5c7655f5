"""Write llamacpp_rerank.json: llama.cpp's tokens and scores of each (query, document) pair of
tests/support/rerank_cases.py, for the /v1/rerank tests without llama.cpp.

Run by hand with a Python that has llama-cpp-python and gguf:

    python -m tests.serve.data.make_rerank_refs

The pairs are built as llama.cpp's server builds them (tools/server/server-common.cpp format_prompt_rerank):
the file's `rerank` chat template with {query} and {document} replaced, tokenized without added specials and
with special tokens parsed; else BOS (if the vocabulary adds it), the query, EOS (if it adds EOS; SEP when it
has no EOS), SEP (if it adds SEP), the document, EOS (if it adds EOS). Each pair is decoded alone with rank
pooling and its score is the first value of its sequence's embedding (server-context.cpp send_rerank).
"""

import ctypes
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp

from pyggml.testing.llamacpp import POOLING_TYPES, no_extra_buffer_types

from tests.support.embedding_cases import N_CTX
from tests.support.parity_cases import sha256
from tests.support.rerank_cases import (CASES, DOCUMENTS, LLAMACPP_TEST_DOCUMENTS, LLAMACPP_TEST_QUERY, QUERY,
                                        write_case)

OUT = Path(__file__).parent / "llamacpp_rerank.json"


def pair_tokens(llm, query: str, document: str) -> list[int]:
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    template = llama_cpp.llama_model_chat_template(llm.model, b"rerank")
    if template:
        text = template.decode().replace("{query}", query).replace("{document}", document)
        return llm.tokenize(text.encode(), add_bos=False, special=True)
    eos = llama_cpp.llama_vocab_eos(vocab)
    eos = llama_cpp.llama_vocab_sep(vocab) if eos == llama_cpp.LLAMA_TOKEN_NULL else eos
    add_eos = llama_cpp.llama_vocab_get_add_eos(vocab)
    ids = [llama_cpp.llama_vocab_bos(vocab)] if llama_cpp.llama_vocab_get_add_bos(vocab) else []
    ids += llm.tokenize(query.encode(), add_bos=False, special=False) + ([eos] if add_eos else [])
    ids += [llama_cpp.llama_vocab_sep(vocab)] if llama_cpp.llama_vocab_get_add_sep(vocab) else []
    return ids + llm.tokenize(document.encode(), add_bos=False, special=False) + ([eos] if add_eos else [])


def score(llm, tokens: list[int]) -> float:
    llm._ctx.kv_cache_clear()
    llm._batch.reset()
    llm._batch.add_sequence(tokens, 0, False)
    llm._ctx.decode(llm._batch)
    row = llama_cpp.llama_get_embeddings_seq(llm._ctx.ctx, 0)
    return float(ctypes.cast(row, ctypes.POINTER(ctypes.c_float))[0])


def main():
    summary = {"llama_cpp_python_version": llama_cpp.__version__, "query": QUERY, "documents": DOCUMENTS,
               "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in CASES:
            path = write_case(name, Path(tmp))
            with no_extra_buffer_types(llama_cpp.llama_cpp):
                llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=POOLING_TYPES["rank"],
                                      n_ctx=N_CTX, n_batch=N_CTX, n_ubatch=N_CTX, n_threads=2, flash_attn=False,
                                      verbose=False)
            try:
                tokens = [pair_tokens(llm, QUERY, d) for d in DOCUMENTS]
                summary["cases"][name] = {"sha256": sha256(path), "tokens": tokens,
                                          "scores": [score(llm, t) for t in tokens]}
                if name == "bert-rank":  # the ported llama.cpp test's documents (longer than Qwen3's context here)
                    summary["cases"][name]["llamacpp_test_scores"] = [
                        score(llm, pair_tokens(llm, LLAMACPP_TEST_QUERY, d)) for d in LLAMACPP_TEST_DOCUMENTS]
            finally:
                llm.close()
            print(name, summary["cases"][name]["scores"], file=sys.stderr)
    OUT.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
