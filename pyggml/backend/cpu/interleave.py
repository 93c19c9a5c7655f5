"""The CPU device's extra buffer type "CPU_INTERLEAVED": Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, MXFP4, the K-quants
Q2_K .. Q6_K and IQ4_XS matrices interleaved 16 rows at a time, for the integer products of AVX-512 VNNI or AVX2
(pyggml.backend.cpu.jit.repack, jit/ir/int8_ir.py), as ggml's CPU_REPACK buffer type keeps Q4_0 as block_q4_0x8, Q4_K as
block_q4_Kx8 and MXFP4 as block_mxfp4x8 for its integer kernels. A MoE layer's stack of experts (3-D) is each
expert's matrix interleaved in turn, so MUL_MAT_ID multiplies the experts a token chose with the same kernels.

The layout moves the file's bytes and adds none (jit/repack.py), so a weight takes its size in the file.
The loader puts a model's matrices of these types here when the CPU has int8 products (`takes`); the products
then quantize their activations to Q8_0 (Q8_K for the K-quants and IQ4_XS) and multiply in int8, prompt and generation
alike (within test-backend-ops' 5e-4 NMSE, as ggml's own CPU kernels, which quantize activations the same way). Like
CPU_F32, the buffer is not host memory to the rest of the system: tensor_get and memset refuse, only
MUL_MAT, MUL_MAT_ID and GET_ROWS read it (`Tensor.extra` is INTERLEAVED).
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

import numpy as np

from pyggml.backend.base import BufferType, Status
from pyggml.backend.cpu.buffer import TENSOR_ALIGNMENT, ConvertedBuffer
from pyggml.backend.cpu.jit.ir.int8_ir import int8_instructions
from pyggml.backend.cpu.jit.ir.vnni_ir import FORMATS, ROWS
from pyggml.backend.cpu.jit.ir.vnni_k_ir import K_FORMATS
from pyggml.backend.cpu.jit.repack import repack_16x4_into
from pyggml.backend.cpu.kernels._common import INTERLEAVED, split_over_threads
from pyggml.core import types as T
from pyggml.core.host_memory import aligned_bytes, map_for_reading, populate
from pyggml.core.tensor import Tensor
from pyggml.errors import BackendError

INTERLEAVED_TYPES = frozenset(FORMATS) | frozenset(K_FORMATS)
# A write is repacked in pieces of about this size, each kernel thread taking the next when done: one parallel
# loop split in equal halves waited for a thread that shared its core with another process (a 1B file's layers:
# 0.7 to 1.7 s on two busy cores, 0.2 s on one thread).
PIECE_BYTES = 1 << 21
# The sources that decide the layout (relative to this folder).
LAYOUT_SOURCES = ("jit/repack.py", "jit/ir/vnni_ir.py", "jit/ir/vnni_k_ir.py", "interleave.py")


def has_int8_products() -> bool:
    """Whether this CPU multiplies int8 vectors as the tiles need (AVX-512 VNNI, or AVX2: jit/ir/int8_ir.py)."""
    return int8_instructions() is not None


def interleavable(type_, ne) -> bool:
    """A matrix, or a stack of them (3-D: a MoE layer's experts), of an interleaved type (INTERLEAVED_TYPES) of
    whole ROWS-row groups, on a CPU with int8 products."""
    ne = list(ne) + [1] * (4 - len(ne))
    return int(type_) in INTERLEAVED_TYPES and ne[1] % ROWS == 0 and ne[3] == 1 and has_int8_products()


class InterleavedBuffer(ConvertedBuffer):
    """Tensors in the 16x4 layout of their type, converted as whole 16-row groups are written.

    Thread-safety: as CpuBuffer (disjoint tensors may be written concurrently).
    """

    what = "interleaved"

    def quant_bytes(self, t: Tensor) -> np.ndarray:
        """t's interleaved bytes (read-only uint8), what the products read."""
        start = self.offset_of(t)
        out = self._host[start: start + t.nbytes].view()
        out.flags.writeable = False
        return out

    def _init_tensor(self, t: Tensor) -> Status:
        if t.view_src is not None or not interleavable(t.type, t.ne):
            names = ", ".join(T.type_name(q) for q in sorted(INTERLEAVED_TYPES))
            raise BackendError(f"buffer type CPU_INTERLEAVED holds whole matrices (or 3-D stacks of them) of {names} "
                               f"of {ROWS}-row groups on a CPU with AVX-512 VNNI or AVX2; {t.name!r} is "
                               f"{T.type_name(t.type)}{list(t.ne)}{' (a view)' if t.view_src is not None else ''}")
        t.extra = INTERLEAVED
        return Status.SUCCESS

    def _set_tensor(self, t: Tensor, data: memoryview, offset: int, size: int) -> None:
        group = ROWS * T.row_size(t.type, t.ne[0])
        if offset % group or size % group:
            raise BackendError(f"CPU_INTERLEAVED: writes to {t.name!r} must be whole groups of {ROWS} rows ({group} "
                               f"bytes; got {size} bytes at offset {offset})")
        src = np.frombuffer(data, np.uint8, count=size)
        start = self.offset_of(t) + offset
        dst = self._host[start: start + size]
        piece = max(1, PIECE_BYTES // group) * group
        row_bytes = T.row_size(t.type, t.ne[0])

        def repack(i: int) -> None:
            at = i * piece
            part, out = src[at: at + piece], dst[at: at + piece]
            map_for_reading(part)
            populate(out.ctypes.data, out.nbytes)
            repack_16x4_into(int(t.type), part.reshape(-1, row_bytes), out)

        split_over_threads(repack, -(-size // piece))


@functools.cache
def _layout_version() -> str:
    here = Path(__file__).resolve().parent
    digest = hashlib.sha256(f"{ROWS} rows a group".encode())   # 16, or 8 on a CPU with AVX2 alone
    for name in LAYOUT_SOURCES:
        digest.update((here / name).read_bytes())
    return digest.hexdigest()[:16]


class InterleavedBufferType(BufferType):
    """Thread-safety: alloc_buffer may be called from any thread."""

    name = "CPU_INTERLEAVED"
    alignment = TENSOR_ALIGNMENT
    group_rows = ROWS    # a matrix's rows come in whole groups of this many
    is_host = False

    @staticmethod
    def takes(type_, ne) -> bool:
        """Whether a weight of this type and shape goes here (what the model loader asks)."""
        return interleavable(type_, ne)

    def _alloc_buffer(self, size: int) -> InterleavedBuffer:
        """Memory in 4 KiB pages (see aligned_bytes), made resident piece by piece by the repack threads as they
        write it. A thread of its own that made it resident from the end while the loader did the rest slowed the
        load on a virtual machine: the page faults of two threads at once, and the kernels' load waiting on them
        (an 8B file's load 2.4-8.2 s with it, 1.8-3.7 s without; a 1B file's 0.55-0.56 s against 0.46-0.47)."""
        return InterleavedBuffer(self, aligned_bytes(size, fill=None, huge_pages=False))

    def _alloc_size(self, t: Tensor) -> int:
        return t.nbytes

    @property
    def layout_version(self) -> str:
        """A digest of the sources that decide the layout: a copy of a buffer kept on disk (the loader's layout
        cache) is stale when it changes."""
        return _layout_version()

    @staticmethod
    def converted(type_, rows: np.ndarray) -> np.ndarray:
        """The bytes a buffer of this type holds for `rows` (uint8, whole 16-row groups of type_'s rows)."""
        out = np.empty(rows.size, np.uint8)
        repack_16x4_into(int(type_), rows, out)
        return out

    def buffer_over(self, array: np.ndarray) -> InterleavedBuffer:
        """A buffer over a file's mapping from the loader's layout cache (pyggml.models.gguf.layout_cache): an entry
        that holds the interleaved bytes already, or a new entry's file that the repack writes."""
        return InterleavedBuffer(self, array)
