"""Host memory helpers: populate() makes anonymous pages resident in one call (what a plan's graph uses of a
compute buffer, weight buffers when made; other buffers fault their pages in as written); release_file_pages()
hands a read-only file mapping's pages back, and nothing else."""

import mmap
import sys

import numpy as np
import pytest

from pyggml.backend import BufferUsage, init_by_name, tensor_alloc
from pyggml.backend.cpu.interleave import InterleavedBufferType
from pyggml.core import Context, Graph, ops
from pyggml.core.host_memory import aligned_bytes, map_for_reading, populate, release_file_pages, zero_anonymous
from tests.support.resident import mapping_of, resident_share

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


def test_map_for_reading_maps_every_page_a_view_touches_in_one_call(data_file):
    """A piece of a file mapping is mapped whole before a kernel reads it, the pages it only partly covers too."""
    with open(data_file, "rb") as f:
        buf = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), np.uint8)
    assert resident_kib(buf) == 0
    if not map_for_reading(buf[100: 100 + 3 * mmap.PAGESIZE]):
        pytest.skip("no MADV_POPULATE_READ (Linux 5.14) here")
    assert resident_kib(buf) >= 4 * mmap.PAGESIZE // 1024     # (the kernel may map the pages around them too)
    assert map_for_reading(buf[100: 100 + 3 * mmap.PAGESIZE])  # mapped already: a look, still True


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


MIB = 1 << 20
FRESH = 40 * MIB  # cleared by handing its pages back first (a new array may be a recycled, resident heap chunk)


def test_populate_makes_the_whole_pages_resident():
    arr = aligned_bytes(FRESH, fill=None)
    zero_anonymous(arr)
    assert resident_share(arr) < 0.5  # its pages handed back: not there
    assert populate(arr.ctypes.data, arr.nbytes)
    assert resident_share(arr) == 1.0
    assert populate(arr.ctypes.data, arr.nbytes)  # resident already: a look, still True


def test_populate_refuses_a_range_without_a_whole_page():
    arr = aligned_bytes(mmap.PAGESIZE, fill=None)
    assert not populate(arr.ctypes.data + 1, mmap.PAGESIZE - 2)


def vm_flags(address: int) -> set[str]:
    """The VmFlags of the mapping holding address (/proc/self/smaps): "hg" asked for huge pages, "nh" refused."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                start, end = (int(x, 16) for x in head.split("-"))
                inside = start <= address < end
            elif inside and head == "VmFlags:":
                return set(line.split()[1:])
    raise LookupError(f"no mapping holds 0x{address:x}")


def test_huge_pages_refused_before_the_first_write_where_asked():
    """NumPy advises huge pages on large arrays; the CPU buffers and CPU_INTERLEAVED take 4 KiB pages (a fresh
    huge page's first write cost 3-5x more on a virtual machine: aligned_bytes)."""
    inner = 2 * mmap.PAGESIZE  # past the partial page the array starts in
    assert "nh" not in vm_flags(aligned_bytes(FRESH, fill=None).ctypes.data + inner)
    small = aligned_bytes(FRESH, fill=None, huge_pages=False)
    assert "nh" in vm_flags(small.ctypes.data + inner) and "hg" not in vm_flags(small.ctypes.data + inner)
    for buft in (init_by_name("CPU").default_buffer_type, InterleavedBufferType(None)):
        buf = buft.alloc_buffer(FRESH)
        assert "nh" in vm_flags(buf.base + inner), buft.name


def test_compute_buffers_are_resident_where_a_plan_uses_them_others_are_not():
    """A compute buffer is reserved for the largest step: a plan makes its own graph's tensors resident, the rest
    of the buffer (and any other buffer) faults its pages in as written."""
    backend = init_by_name("CPU")
    plain, compute = (backend.default_buffer_type.alloc_buffer(FRESH) for _ in range(2))
    plain.clear(0)
    compute.clear(0)  # both without resident pages (a large buffer's clear hands them back)
    compute.usage = BufferUsage.COMPUTE
    ctx = Context(no_alloc=True)
    x = ctx.new_tensor("f32", (FRESH // 16,), "x")  # a quarter of the buffer each
    y = ops.scale(ctx, x, 2.0)
    tensor_alloc(compute, x, compute.base)
    tensor_alloc(compute, y, compute.base + FRESH // 2)
    tensor_alloc(plain, ctx.new_tensor("f32", (8,), "unused"), plain.base)
    assert resident_share(compute.host_array) < 0.1
    backend.graph_plan_free(backend.graph_plan_create(Graph().build_forward_expand(y)))
    memory = compute.host_array
    assert resident_share(memory[: x.nbytes]) == resident_share(memory[FRESH // 2: FRESH // 2 + y.nbytes]) == 1.0
    assert resident_share(memory) < 0.6
    assert resident_share(plain.host_array) < 0.5
