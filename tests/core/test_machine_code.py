"""Numba's code libraries made into machine code only where it is asked for (pyggml.core.machine_code)."""

import os
import subprocess
import sys

import numpy as np
from numba import prange

from pyggml.core.jit import jit, parallel_jit


@jit(cache=False)
def _twice(x):
    return x * np.float32(2)


@parallel_jit(cache=False)
def _twice_rows(a, out):
    for i in prange(a.shape[0]):
        for j in range(a.shape[1]):
            out[i, j] = _twice(a[i, j])


def _libraries_below(library) -> list:
    found = []
    for linked in library._linking_libraries:
        found += [linked, *_libraries_below(linked)]
    return found


def test_a_prange_loop_body_is_machine_code_only_inside_its_kernel():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.empty_like(a)
    _twice_rows(a, out)
    assert np.array_equal(out, a * 2)
    kernel = next(iter(_twice_rows.overloads.values())).library
    callee = next(iter(_twice.overloads.values())).library
    loop_parts = {lib for lib in _libraries_below(kernel) if "gufunc" in lib.name.lower()}
    assert len(loop_parts) == 3 and all(lib._awaits_machine_code for lib in loop_parts)  # body, 2 wrappers: IR only
    assert not hasattr(kernel, "_awaits_machine_code") and not hasattr(callee, "_awaits_machine_code")
    assert _twice(np.float32(3)) == 6  # a dispatcher's function is callable from Python as ever


def test_a_kernel_compiled_lazily_loads_from_the_disk_cache(tmp_path):
    """Compiled in one process (object code made for the cache), loaded in the next without compiling."""
    code = """
import numpy as np
from pyggml.core.jit import compile_seconds
import kernel_for_cache as k
a = np.arange(64, dtype=np.float32)
out = np.empty_like(a)
k.scaled(a, out)
assert np.array_equal(out, a * 3 + 1), out
print(compile_seconds() > 0)
"""
    (tmp_path / "kernel_for_cache.py").write_text("""
import numpy as np
from numba import prange
from pyggml.core.jit import jit, parallel_jit

@jit
def _step(x):
    return x * np.float32(3) + np.float32(1)

@parallel_jit
def scaled(a, out):
    for i in prange(a.shape[0]):
        out[i] = _step(a[i])
""")
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", ""), os.getcwd()])}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    assert [run.stdout.split() for run in runs] == [["True"], ["False"]]
