"""Write llamacpp_embeddings.npz and llamacpp_embeddings.json: llama.cpp's embeddings of the random-weight
models of tests/support/embedding_cases.py, for the tests of Model.embed without llama.cpp.

Run by hand with a Python that has llama-cpp-python and gguf:

    python -m tests.models.data.make_embedding_refs

For each case the npz holds `<case>/tokens` (every text's tokens, concatenated), `<case>/lengths` and
`<case>/embeddings` (raw: one row per text, per token for pooling "none", a reranker's scores per text for
"rank"); the json holds each file's digest, so a writer change that alters a file is caught rather than
compared with another model's numbers.
"""

import json
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np

from pyggml.testing.llamacpp import llamacpp_embeddings

from tests.support.embedding_cases import CASES, N_CTX, TEXTS, write_case
from tests.support.parity_cases import sha256

DATA = Path(__file__).parent
REFS = DATA / "llamacpp_embeddings.npz"
SUMMARY = DATA / "llamacpp_embeddings.json"


def main():
    arrays, summary = {}, {"llama_cpp_python_version": llama_cpp.__version__, "kv_type": "F32", "texts": TEXTS,
                           "cases": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for case in CASES:
            path = write_case(case, Path(tmp))
            tokens, rows = llamacpp_embeddings(path, TEXTS, case.pooling, n_ctx=N_CTX)
            arrays[f"{case.name}/tokens"] = np.concatenate(tokens).astype(np.int32)
            arrays[f"{case.name}/lengths"] = np.array([len(t) for t in tokens], np.int32)
            arrays[f"{case.name}/embeddings"] = np.concatenate(rows) if case.pooling == "none" else np.stack(rows)
            summary["cases"][case.name] = {"sha256": sha256(path), "pooling": case.pooling}
            print(case.name, arrays[f"{case.name}/embeddings"].shape, file=sys.stderr)
    np.savez_compressed(REFS, **arrays)
    SUMMARY.write_text(json.dumps(summary, indent=1) + "\n")
    print(f"wrote {REFS} and {SUMMARY}", file=sys.stderr)


if __name__ == "__main__":
    main()
