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


def test_a_cached_librarys_symbols_are_read_from_its_object_code():
    """What the ELF symbol table of a compiled library defines is what Numba collects from its IR."""
    import llvmlite.binding as ll

    from pyggml.core.machine_code import elf_defined_symbols

    a = np.arange(8, dtype=np.float32).reshape(2, 4)
    _twice_rows(a, np.empty_like(a))
    for dispatcher in (_twice_rows, _twice):
        library = next(iter(dispatcher.overloads.values())).library
        module = ll.parse_bitcode(library._get_module_for_linking().as_bitcode())
        from_ir = {g.name for values in (module.functions, module.global_variables) for g in values
                   if not g.is_declaration}
        assert elf_defined_symbols(library._get_compiled_object()) == from_ir and from_ir


def test_a_kernel_loaded_from_the_cache_links_into_a_new_compile(tmp_path):
    """A cached kernel's IR is parsed only when a later compile links it in: a function compiled in a process that
    loaded its callee from the cache still calls it."""
    (tmp_path / "callee_for_cache.py").write_text("""
import numpy as np
from pyggml.core.jit import jit

@jit
def cubed(x):
    return x * x * x
""")
    code = """
import sys
import numpy as np
from pyggml.core.jit import jit
import callee_for_cache as c
assert c.cubed(np.float32(2)) == 8
library = next(iter(c.cubed.overloads.values())).library
print(hasattr(library, "_bitcode_for_linking"))

@jit(cache=False)
def caller(x):
    return c.cubed(x) + np.float32(1)

assert caller(np.float32(3)) == 28
print(hasattr(library, "_bitcode_for_linking"))
"""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", ""), os.getcwd()])}
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
            for _ in range(2)]
    assert all(run.returncode == 0 for run in runs), [run.stderr for run in runs]
    # compiled in the first process; loaded from the cache in the second, its IR parsed once caller linked it in
    assert [run.stdout.split() for run in runs] == [["False", "False"], ["True", "False"]]
