"""The compiled kernels' cache: cold detection, and emptied when the package's sources change."""

from pyggml.backend.cpu.jit.runtime import compile_cache


class _Dispatcher:
    """Stands for a Numba dispatcher: only the cache paths are read."""

    def __init__(self, directory, index):
        self._cache = type("Cache", (), {"_cache_path": str(directory)})()
        self._cache._cache_file = type("File", (), {"_index_path": str(directory / index)})()


def test_a_missing_index_means_cold(tmp_path):
    (tmp_path / "warm.nbi").write_bytes(b"")
    assert not compile_cache.is_cold([_Dispatcher(tmp_path, "warm.nbi")])
    assert compile_cache.is_cold([_Dispatcher(tmp_path, "warm.nbi"), _Dispatcher(tmp_path, "cold.nbi")])


def test_cache_files_go_when_the_fingerprint_differs(tmp_path):
    kernel = _Dispatcher(tmp_path, "k.nbi")
    (tmp_path / "k.nbi").write_bytes(b"index")
    (tmp_path / "k.1.nbc").write_bytes(b"code")
    compile_cache.drop_stale(kernel)            # no fingerprint yet: emptied, fingerprint written
    assert not list(tmp_path.glob("*.nb?")) and (tmp_path / compile_cache.FINGERPRINT).exists()
    (tmp_path / "k.nbi").write_bytes(b"index")
    compile_cache.drop_stale(kernel)            # same sources: kept
    assert (tmp_path / "k.nbi").exists()
    (tmp_path / compile_cache.FINGERPRINT).write_text("sources of another version")
    compile_cache.drop_stale(kernel)
    assert not (tmp_path / "k.nbi").exists()


def _run(code: str) -> str:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_model_loads_its_kernels_before_its_first_step(tmp_path):
    """After load_model (cache warm), decoding takes Numba's compiler lock not once: no kernel loads late,
    when all the weights are resident (see compile_cache.load_cached)."""
    from pyggml.testing.synthetic import write_llama

    path = write_llama(tmp_path / "m.gguf", qtype=8)  # Q8_0
    step = f"""
from pyggml.models import load_model
m = load_model({str(path)!r}, n_ctx=64)
m.decode(m.tokenize("hello world")); m.decode([1])
"""
    _run(step)  # warms the cache
    out = _run("""
from numba.core import event
class Count(event.Listener):
    n = 0
    def on_start(self, ev): Count.n += 1
    def on_end(self, ev): pass
""" + step.replace("m.decode(m.tokenize", "event.register('numba:compiler_lock', Count()); m.decode(m.tokenize")
        + "print(Count.n)")
    assert out.split()[-1] == "0"


def test_load_cached_loads_what_the_disk_cache_holds_once():
    out = _run("""
from pyggml.backend.cpu.jit.runtime import compile_cache
from pyggml.backend.cpu.jit.norm import rms_norm_rows
import numpy as np
x = np.ones((2, 8), np.float32); rms_norm_rows(x, x, np.float32(1e-5))
""")
    out = _run("""
from pyggml.backend.cpu.jit.runtime import compile_cache
from pyggml.backend.cpu.jit.norm import rms_norm_rows
first = compile_cache.load_cached([rms_norm_rows])
print(first, len(rms_norm_rows.overloads), compile_cache.load_cached([rms_norm_rows]))
""")
    loaded, overloads, again = map(int, out.split())
    assert loaded >= 1 and overloads == loaded and again == 0
