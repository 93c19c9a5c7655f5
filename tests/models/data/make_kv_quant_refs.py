"""Write llamacpp_kv_quant.npz: llama.cpp's logits on a random-weight model with F16, Q8_0 and Q4_0 K/V caches
(flash attention; llama.cpp stores a quantized K and V rotated by Hadamard matrices), so that
tests/models/test_kv_cache.py checks pyggml's quantized caches against llama.cpp's without llama.cpp.

Run once, by hand, with a Python that has llama-cpp-python (this Python writes the model file):

    python -m tests.models.data.make_kv_quant_refs --llama-python PYTHON
"""

import argparse
import hashlib
import tempfile
from pathlib import Path

import numpy as np

from benchmarks.kv_cache_kld import llama_logits
from pyggml.testing.synthetic import write_llama

OUT = Path(__file__).with_name("llamacpp_kv_quant.npz")
SETTINGS = [("F16", "F16"), ("Q8_0", "Q8_0"), ("Q4_0", "Q4_0"), ("Q4_0", "F16")]  # (K, V)
N_CTX = 128


def write_model(path: Path) -> Path:
    """Heads of 128 values: K's rotation is of order 128, V's of order 64, as llama.cpp picks them."""
    return write_llama(path, n_embd=256, n_head=2, n_head_kv=1, n_layer=2, n_vocab=64, n_ctx=N_CTX, seed=7)


def prompt() -> np.ndarray:
    return np.random.default_rng(11).integers(3, 64, N_CTX).astype(np.int32)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--llama-python", required=True)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = write_model(Path(tmp) / "kv.gguf")
        arrays = {"model_sha256": np.array(hashlib.sha256(Path(model).read_bytes()).hexdigest())}
        for type_k, type_v in SETTINGS:
            logits = llama_logits(args.llama_python, str(model), prompt()[None], N_CTX, 2, type_k, type_v, Path(tmp))
            arrays[f"{type_k}_{type_v}"] = np.asarray(logits[0], np.float32)
    np.savez_compressed(OUT, **arrays)
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
