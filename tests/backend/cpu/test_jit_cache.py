"""The compiled kernels' cache (kept in the user's cache directory, stale when the sources change), kernels made
per ggml type, the compile clock, and a model loading its kernels before its first step."""

import os
import subprocess
import sys
import time
from pathlib import Path

import numba
import numpy as np

from pyggml.core import jit as core_jit


def _run(code: str, **env) -> str:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_the_package_kernels_cache_under_the_cache_root_and_go_stale_with_their_folder(tmp_path):
    from pyggml.backend.cpu.jit.norm import rms_norm_rows

    locator = rms_norm_rows._cache._impl._locator
    assert isinstance(locator, core_jit.PackageCacheLocator)
    path = Path(locator.get_cache_path())
    assert path.parent == core_jit.cache_root() / "backend" / "cpu" / "jit" and len(path.name) == 16
    (tmp_path / "a.py").write_text("x = 1\n")
    before = core_jit.sources_digest(tmp_path)
    (tmp_path / "a.py").write_text("x = 2\n")
    core_jit.sources_digest.cache_clear()
    assert core_jit.sources_digest(tmp_path) != before


def test_two_versions_of_the_sources_keep_their_kernels_apart(tmp_path, monkeypatch):
    """Two installs of different sources (two environments) cache in folders of their own: neither makes the
    other recompile at every alternate run, as one folder with one index per kernel did."""
    from pyggml.backend.cpu.jit.norm import rms_norm_rows

    folder = Path(rms_norm_rows.py_func.__code__.co_filename).resolve().parent
    first = core_jit.PackageCacheLocator(rms_norm_rows.py_func, str(folder / "norm.py")).get_cache_path()
    monkeypatch.setattr(core_jit, "SHARED_KERNELS", tmp_path)
    core_jit.sources_digest.cache_clear()
    (tmp_path / "k.py").write_text("x = 1\n")
    other = core_jit.PackageCacheLocator(rms_norm_rows.py_func, str(folder / "norm.py")).get_cache_path()
    core_jit.sources_digest.cache_clear()
    assert Path(first).parent == Path(other).parent and first != other


def test_the_user_cache_directory_is_the_default(monkeypatch, tmp_path):
    monkeypatch.setattr(numba.config, "CACHE_DIR", "")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert core_jit.cache_root() == tmp_path / "pyggml" / "numba"


def test_the_compile_clock_counts_compiles_and_says_when_one_starts():
    calls = []
    core_jit.when_compiling(lambda: calls.append(1))
    before = core_jit.compile_seconds()

    @numba.njit
    def fresh(x):
        return x * 3 + 1

    assert fresh(np.float32(2)) == 7 and fresh(np.float64(2)) == 7
    assert core_jit.compile_seconds() > before and calls == [1]


def test_a_per_type_kernel_compiles_its_own_type_only(tmp_path):
    """dequantize_rows[Q8_0] in a fresh cache: no other type's dequantizer is compiled."""
    out = _run("""
import numpy as np
from pyggml.backend.cpu.jit import quants
from pyggml.backend.cpu.jit.mul_mat import dequantize_rows
from pyggml.core.types import GGMLType
raw = np.zeros(34, np.uint8); raw[0:2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8); raw[2:] = 2
out = np.empty((1, 32), np.float32)
dequantize_rows(int(GGMLType.Q8_0), raw, np.zeros(1, np.uint64), 1, out)
others = [n for n in dir(quants) if n.startswith("dequantize_row_") and n != "dequantize_row_q8_0"
          and getattr(quants, n).signatures]
print(out[0, 0], len(others))
""", NUMBA_CACHE_DIR=str(tmp_path))
    value, others = out.split()
    assert float(value) == 1.0 and others == "0"


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
    _run("""
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


def test_cache_loads_call_llvm_without_numbas_lock_events_which_come_back_after():
    from llvmlite import binding as llvm
    from numba.core import event

    from pyggml.backend.cpu.jit.runtime.compile_cache import llvm_lock_events_off

    with event.install_recorder("numba:llvm_lock") as during, llvm_lock_events_off():
        llvm.get_process_triple()
    with event.install_recorder("numba:llvm_lock") as after:
        llvm.get_process_triple()
    assert during.buffer == [] and after.buffer  # the lock taken and released at each call into LLVM


def test_a_model_from_a_warm_cache_runs_without_numbas_implementation_registries(tmp_path):
    """Cached kernels load without the refresh of Numba's target context (QuickLoadCache): a model loads and
    decodes, the same logits as a process that compiled, and Numba's implementations (numba.np.linalg, imported
    only by that refresh) are never imported, nor the modules of the environments the kernels bring back
    (numba.np.arrayobj: rebuild_environment); compiling a new kernel afterwards still works (it refreshes), one
    that allocates with those environments' functions too."""
    from pyggml.testing.synthetic import write_llama

    path = write_llama(tmp_path / "m.gguf", qtype=8)  # Q8_0
    step = f"""
import sys, numpy as np
from pyggml.models import load_model
m = load_model({str(path)!r}, n_ctx=64)
print(float(m.decode(m.tokenize("hello world")).sum()), "numba.np.linalg" in sys.modules,
      "numba.np.arrayobj" in sys.modules)
"""
    cache = str(tmp_path / "cache")
    first = _run(step, NUMBA_CACHE_DIR=cache).split()  # compiles
    warm = _run(step + """
import numba
from pyggml.backend.cpu.jit.norm import rms_norm_rows
twice = numba.njit(lambda x: 2 * x)
zeros = numba.njit(lambda n: np.zeros((n, 2), np.float32).reshape(-1).sum() + n)
print(twice(21), zeros(3), type(rms_norm_rows._cache).__name__)
""", NUMBA_CACHE_DIR=cache).split()
    assert warm[0] == first[0] and first[1:3] == ["True", "True"] and warm[1:3] == ["False", "False"]
    assert warm[3:] == ["42", "3.0", "QuickLoadCache"]


def test_a_kernel_two_processes_miss_at_once_is_compiled_by_one(tmp_path):
    """CompileLocks: a process that misses a kernel while another compiles it waits for the other's save and
    loads that, compiling nothing. The first process is held at the start of its compile until the second has
    called the kernel and not begun a compile of its own for two seconds."""
    files = {name: str(tmp_path / name) for name in ("started", "go", "calling", "b_compiles")}
    call = """
import numpy as np
from pyggml.core import jit
from pyggml.backend.cpu.jit.norm import rms_norm_rows
x = np.ones((2, 8), np.float32) * np.arange(8, dtype=np.float32)
{listen}
rms_norm_rows(x, x, np.float32(1e-5))
print(jit.COMPILE_CLOCK.compiles, repr(float(x.sum())))
"""
    hold = f"""
import os, time
from numba.core import event
class Hold(event.Listener):
    def on_start(self, ev):
        open({files["started"]!r}, "w").close()
        while not os.path.exists({files["go"]!r}):
            time.sleep(0.02)
    def on_end(self, ev):
        pass
event.register("numba:compile", Hold())
"""
    mark = f"""
from numba.core import event
class Mark(event.Listener):
    def on_start(self, ev):
        open({files["b_compiles"]!r}, "w").close()
    def on_end(self, ev):
        pass
event.register("numba:compile", Mark())
open({files["calling"]!r}, "w").close()
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}

    def start(listen: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", call.format(listen=listen)], env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def wait_for(name: str, process: subprocess.Popen) -> None:
        deadline = time.monotonic() + 300
        while not os.path.exists(files[name]):
            assert process.poll() is None, process.communicate()[1]
            assert time.monotonic() < deadline, f"no {name} within 300 s"
            time.sleep(0.05)

    first = start(hold)
    second = None
    try:
        wait_for("started", first)
        second = start(mark)
        wait_for("calling", second)
        time.sleep(2.0)
        assert second.poll() is None and not os.path.exists(files["b_compiles"])  # waiting, not compiling
        open(files["go"], "w").close()
        outs = [process.communicate(timeout=300) for process in (first, second)]
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.kill()
    assert first.returncode == 0 and second.returncode == 0, [err for _, err in outs]
    (compiled, total), (loaded, same) = (out.split() for out, _ in outs)
    assert int(compiled) >= 1 and int(loaded) == 0 and total == same
    assert not os.path.exists(files["b_compiles"])


def test_a_compile_that_raises_lets_go_of_its_lock(tmp_path):
    """A kernel that fails to compile saves nothing: its lock goes at the compile's end, not at the process's."""
    (tmp_path / "kernels.py").write_text("from pyggml.core.jit import jit\n\n@jit\ndef bad(x):\n    return x.nope\n")
    out = _run(f"""
import sys; sys.path.insert(0, {str(tmp_path)!r})
import kernels
from pyggml.core import jit
try:
    kernels.bad(1)
except Exception as e:
    print(type(e).__name__, len(jit.COMPILE_LOCKS._held))
""", NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    assert out.split() == ["TypingError", "0"]


def test_a_lock_file_that_cannot_be_opened_leaves_the_compile_unlocked(monkeypatch):
    """A cache shared between users may hold another's lock file, which this one cannot open: compile unlocked."""
    from numba import types

    from pyggml.backend.cpu.jit.norm import rms_norm_rows

    fresh = core_jit.jit(rms_norm_rows.py_func)
    assert fresh._cache.cache_path  # made on this first use
    cache = fresh._cache

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(core_jit.os, "open", refuse)
    sig = (types.float32[:, ::1], types.float32[:, ::1], types.float32)
    assert core_jit.COMPILE_LOCKS.acquire(cache, sig, fresh.targetctx) is False
    assert not core_jit.COMPILE_LOCKS._held


def test_load_cached_hands_llvms_pages_back_once_after_all_its_loads():
    _run("""
from pyggml.backend.cpu.jit.norm import norm_rows, rms_norm_rows
import numpy as np
x = np.ones((2, 8), np.float32); rms_norm_rows(x, x, np.float32(1e-5)); norm_rows(x, x, np.float32(1e-5))
""")
    out = _run("""
from pyggml.backend.cpu.jit.runtime import compile_cache, compiler_pages
from pyggml.backend.cpu.jit.norm import norm_rows, rms_norm_rows
releases = []
compiler_pages.release_compiler_pages = lambda: releases.append(1)
print(compile_cache.load_cached([rms_norm_rows, norm_rows]), len(releases))
""")
    loaded, releases = map(int, out.split())
    assert loaded >= 2 and releases == 1


def test_the_cpu_backend_offers_threads_and_kernel_loading_as_extensions():
    from pyggml.backend import init_by_name, load_kernels, set_n_threads

    backend = init_by_name("CPU")
    assert set_n_threads(backend, 3) and backend.n_threads == 3
    assert load_kernels(backend, [8]) >= 0


def test_a_models_types_load_their_own_row_writes_and_activation_quantizers_only():
    from pyggml.backend.cpu.jit import repack, rows
    from pyggml.backend.cpu.jit.runtime.compile_cache import type_kernels
    from pyggml.core.types import GGMLType

    q4_1_f16_cache = type_kernels([GGMLType.F32, GGMLType.Q4_1, GGMLType.F16])
    assert rows.set_rows_f16 in q4_1_f16_cache and repack.quantize_q8_0_rows in q4_1_f16_cache
    assert not {rows.set_rows_q8_0, rows.set_rows_q4_0, repack.quantize_q8_K_rows} & set(q4_1_f16_cache)
    every = type_kernels(None)
    assert {rows.set_rows_f32, rows.set_rows_q4_0, repack.quantize_q8_K_parallel} <= set(every)


def test_a_dispatchers_disk_cache_is_made_once_when_first_used():
    """CacheOnFirstUse: `import pyggml` decorates many functions and a model uses few; each one's QuickLoadCache
    is made at its first use and then stands in the dispatcher's place, the same one however it is reached."""
    from pyggml.backend.cpu.jit.norm import rms_norm_rows

    fresh = core_jit.jit(rms_norm_rows.py_func)  # a new dispatcher of a package kernel: nothing used yet
    stand_in = fresh._cache
    assert type(stand_in) is core_jit.CacheOnFirstUse
    path = stand_in.cache_path  # a first use: makes the cache
    made = fresh._cache
    assert type(made) is core_jit.QuickLoadCache and made.cache_path == path
    assert stand_in._cache_file is made._cache_file  # reached through the stand-in again: the same cache
    x = np.ones((2, 8), np.float32)
    fresh(x, x, np.float32(1e-5))
    assert fresh._cache is made and np.allclose(x, 1.0, atol=1e-3)
