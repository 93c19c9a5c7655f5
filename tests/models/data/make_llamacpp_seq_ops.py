"""Write llamacpp_seq_ops.json: llama.cpp's sequence positions after random seq_* operations, for CI without
llama.cpp (tests/models/test_kv_cells.py replays the operations on pyggml's KVCells).

Run by hand with a Python that has llama-cpp-python:

    python -m tests.models.data.make_llamacpp_seq_ops

Each case is a list of operations on a unified cache of 4 sequences (decode n tokens into a sequence,
seq_rm, seq_cp, seq_keep, seq_add, seq_div); after each one the file keeps every sequence's
[seq_pos_min, seq_pos_max] as llama.cpp reports them.
"""

import json
import tempfile
from pathlib import Path

import numpy as np

from pyggml.models.llm.kv_cells import KVCells
from pyggml.testing.llamacpp_batched import LlamaCppSequences
from pyggml.testing.synthetic import write_llama

OUT = Path(__file__).with_name("llamacpp_seq_ops.json")
N_SEQ, N_CTX, N_CASES, N_OPS = 4, 256, 12, 30


def random_ops(rng: np.random.Generator, n_ops: int) -> list[list]:
    """Operations that keep every decode within the cache (checked on a KVCells as they are drawn)."""
    cells, ops = KVCells(N_CTX, N_SEQ), []
    for _ in range(n_ops):
        kind = rng.choice(["decode", "decode", "rm", "cp", "keep", "add", "div"])
        s, t = int(rng.integers(N_SEQ)), int(rng.integers(N_SEQ))
        p0, p1 = (int(x) for x in rng.integers(-1, 24, 2))
        if kind == "decode":
            n = int(rng.integers(1, 9))
            if cells.size - cells.used < n:
                continue
            op = ["decode", s, n]
        elif kind == "rm":
            op = ["rm", s if rng.random() < 0.85 else -1, p0, p1]
        elif kind == "cp":
            op = ["cp", s, t, p0, p1]
        elif kind == "keep":
            op = ["keep", s]
        elif kind == "add":
            op = ["add", s, p0, p1, int(rng.integers(-6, 7))]
        else:
            op = ["div", s, p0, p1, int(rng.integers(1, 4))]
        apply_op(cells, op)
        ops.append(op)
    return ops


def apply_op(target, op: list) -> None:
    """One operation on a KVCells, or on anything with decode(tokens, positions, seq_ids, logits) and seq_*."""
    kind, args = op[0], op[1:]
    if kind == "decode":
        s, n = args
        p0 = target.seq_pos_max(s) + 1
        if isinstance(target, KVCells):
            target.apply(target.find_slot(n), range(p0, p0 + n), [(s,)] * n)
        else:
            target.decode([5] * n, list(range(p0, p0 + n)), [(s,)] * n, [False] * (n - 1) + [True])
    else:
        getattr(target, f"seq_{kind}")(*args)


def positions(target) -> list[list[int]]:
    return [[target.seq_pos_min(s), target.seq_pos_max(s)] for s in range(N_SEQ)]


def main() -> None:
    rng = np.random.default_rng(0)
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "llama.gguf"
        write_llama(path, n_ctx=N_CTX)
        llm = LlamaCppSequences(path, n_ctx=N_CTX, n_batch=16, n_seq_max=N_SEQ)
        try:
            for _ in range(N_CASES):
                llm.clear()
                ops, after = random_ops(rng, N_OPS), []
                for op in ops:
                    apply_op(llm, op)
                    after.append(positions(llm))
                cases.append({"ops": ops, "positions": after})
        finally:
            llm.close()
    OUT.write_text(json.dumps({"n_seq": N_SEQ, "n_ctx": N_CTX, "cases": cases}, indent=None) + "\n")


if __name__ == "__main__":
    main()
