"""Host memory helpers: handing a read-only file mapping's pages back, and nothing else."""

import mmap
import sys

import numpy as np
import pytest

from pyggml.core.host_memory import release_file_pages
from tests.support.resident import mapping_of

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/smaps and madvise are Linux's")
PAGES = 64


def resident_kib(arr: np.ndarray) -> int:
    return mapping_of(arr).rss_kib


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(np.arange(PAGES * mmap.PAGESIZE, dtype=np.uint8).tobytes())
    return path


def test_read_only_mapping_pages_go_and_read_back(data_file):
    with open(data_file, "rb") as f:
        buf = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    expected = int(buf.astype(np.int64).sum())                 # every page touched, so resident
    assert resident_kib(buf) >= PAGES * mmap.PAGESIZE // 1024
    tensor = buf[100:100 + (PAGES - 2) * mmap.PAGESIZE]        # a view starting inside the first page
    assert release_file_pages(tensor)
    # the whole pages inside the view went; the two it only partly covers and the last one, after it, stay
    assert resident_kib(buf) == 3 * mmap.PAGESIZE // 1024
    assert int(buf.astype(np.int64).sum()) == expected         # read from the file again, unchanged


def test_through_a_memoryview_as_the_gguf_reader_holds_it(data_file):
    with open(data_file, "rb") as f:
        view = memoryview(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ))
    arr = np.frombuffer(view[mmap.PAGESIZE:], np.uint8)
    arr.sum()
    assert release_file_pages(arr)
    assert resident_kib(arr) <= mmap.PAGESIZE // 1024


def test_own_memory_and_writable_mappings_are_left_alone(data_file):
    own = np.arange(PAGES * mmap.PAGESIZE, dtype=np.uint8)
    assert not release_file_pages(own) and not release_file_pages(own[mmap.PAGESIZE:])
    assert (own == np.arange(PAGES * mmap.PAGESIZE, dtype=np.uint8)).all()
    with open(data_file, "r+b") as f:
        private = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), np.uint8)
    private[:] = 7                                             # written pages exist only in this process
    assert not release_file_pages(private)
    assert (private == 7).all()
    assert not release_file_pages(np.zeros(0, np.uint8))
