"""LLVM's pages handed back after kernel loads: which mappings qualify, and that the process keeps working."""

import subprocess
import sys

import pytest

from pyggml.backend.cpu.jit.runtime import compiler_pages

SMAPS = """\
7f0000000000-7f0000300000 r--p 00000000 08:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                3072 kB
Anonymous:             0 kB
Swap:                  0 kB
7f0000300000-7f0005300000 r-xp 00300000 08:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:               20480 kB
Anonymous:             0 kB
Swap:                  0 kB
7f0005300000-7f0005400000 r--p 05300000 08:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                1024 kB
Anonymous:          1024 kB
Swap:                  0 kB
7f0005400000-7f0005410000 rw-p 05400000 08:01 42 /venv/llvmlite/binding/libllvmlite.so
Rss:                  64 kB
Anonymous:             0 kB
Swap:                  0 kB
7f0006000000-7f0006100000 r--p 00000000 08:01 43 /venv/llvmlite/binding/libllvmlite.so
Rss:                 512 kB
Anonymous:             0 kB
Swap:                  4 kB
7f0007000000-7f0007100000 rw-p 00000000 00:00 0
Rss:                1024 kB
Anonymous:          1024 kB
"""


def test_only_read_only_mappings_without_private_pages_qualify():
    maps = compiler_pages.parse_smaps(SMAPS)
    assert len(maps) == 6 and maps[1].start == 0x7f0000300000 and maps[1].rss_kib == 20480
    assert [m.holds_only_file_pages for m in maps[:5]] == [True, True, False, False, False]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
def test_after_a_kernel_load_llvm_holds_little_and_kernels_still_compile_and_run():
    code = """
import numpy as np
from pyggml.backend.cpu.jit import jit
from pyggml.backend.cpu.jit.runtime import compiler_pages
from pyggml.backend.cpu.jit.norm import rms_norm_rows
x = np.ones((2, 8), np.float32); rms_norm_rows(x, x, np.float32(1e-5))
held = sum(m.rss_kib for m in compiler_pages.compiler_mappings() if m.holds_only_file_pages)
@jit(cache=False)
def twice(v):
    return v * 2
print(held, twice(21), float(x[0, 0]))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    held, doubled, normed = done.stdout.split()
    assert int(held) < 4096 and doubled == "42" and float(normed) == pytest.approx(1.0, rel=1e-4)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
def test_llvms_mappings_are_read_from_smaps_once_and_advised_at_every_release(monkeypatch):
    compiler_pages.file_only_mappings.cache_clear()
    reads = []
    read = compiler_pages.compiler_mappings
    monkeypatch.setattr(compiler_pages, "compiler_mappings", lambda: reads.append(1) or read())
    first, second = compiler_pages.release_compiler_pages(), compiler_pages.release_compiler_pages()
    assert len(reads) == 1 and first == second == len(compiler_pages.file_only_mappings()) > 0
