"""Float32 copies of non-F32 matrix operands (quantized, F16, BF16 weights), reused while their bytes are unchanged.

Dequantizing a Q4_K matrix costs ~200x a BLAS matrix-vector product over it, so decode-style graphs
would be dominated by it. An entry is keyed by the tensor's address and type (a new layout there, such
as a KV-cache view growing by 256 cells, replaces it), and is trusted only while the raw bytes are
those it was made from, checked at every use without hooks (any write, by tensor_set, a kernel or a
memset, is seen):
- block types keep a CRC-32 of the raw bytes (~4-6 GB/s to check) and are converted again on a change;
- element types (F16, BF16: a KV cache) keep a copy of the raw elements and convert only the elements
  that differ, so a cache that gains one token per step costs a compare, not a conversion (~1.4 GB/s).
"""

from __future__ import annotations

import threading
import weakref
import zlib
from collections import OrderedDict
from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from pyggml.backend.cpu.jit.quants import BLOCKS
from pyggml.core import types as T
from pyggml.core.tensor import Tensor, host_ndarray
from pyggml.errors import UnsupportedTypeError

DEFAULT_BUDGET_BYTES = 2 << 30


@lru_cache(maxsize=None)
def dequantizable(type_) -> bool:
    """Whether values of this type can be read as float32 here: plain float types, the types the compiled kernels
    decode (known without importing gguf, 25 ms of a start) and what gguf dequantizes."""
    type_ = T.as_type(type_)
    if type_ in (T.GGMLType.F32, T.GGMLType.F16, T.GGMLType.BF16) or type_ in BLOCKS:
        return True
    if not T.is_quantized(type_):
        return False
    try:
        T.to_float(type_, np.zeros(T.type_size(type_), dtype=np.uint8))
    except UnsupportedTypeError:
        return False
    return True


@dataclass
class _Entry:
    layout: tuple
    crc: int | None           # block types: CRC-32 of the raw bytes
    bits: np.ndarray | None   # element types: the raw elements, as unsigned integers
    values: np.ndarray
    buffer: weakref.ref | None  # the buffer holding the raw bytes: the entry goes when it is freed or collected

    @property
    def nbytes(self) -> int:
        return self.values.nbytes + (self.bits.nbytes if self.bits is not None else 0)

    @property
    def dead(self) -> bool:
        buffer = self.buffer() if self.buffer is not None else None
        return self.buffer is not None and (buffer is None or buffer.is_freed)


class DequantCache:
    """LRU of float32 copies, bounded by `budget_bytes` (the copies and the raw elements kept to compare).

    Thread-safety: safe from several threads (CPU backends on several threads share DEQUANT_CACHE).
    """

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES):
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()  # CPU backends on several threads share one cache

    @property
    def nbytes(self) -> int:
        return self._bytes

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._bytes = 0

    def get(self, t: Tensor) -> np.ndarray:
        """t's values as float32 (shape ne[::-1], read-only): cached if t's bytes are those seen last time."""
        raw = host_ndarray(t)
        key = (t.data, t.type)
        layout = (tuple(t.ne), tuple(t.nb))
        blocks = T.is_quantized(t.type)
        if blocks:
            crc, bits = zlib.crc32(raw if raw.flags.c_contiguous else np.ascontiguousarray(raw)), None
        else:
            crc, bits = None, raw.view(np.dtype(f"u{raw.itemsize}"))
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and entry.layout == layout and (not blocks or entry.crc == crc):
                if not blocks:
                    self._refresh(entry, t, raw, bits)
                self._entries.move_to_end(key)
                self.hits += 1
                return entry.values
            self.misses += 1
            self._drop_dead()
        values = T.to_float(t.type, raw).reshape(tuple(reversed(t.ne)))
        values = np.ascontiguousarray(values, dtype=np.float32)
        values.flags.writeable = False
        buffer = t.view_src.buffer if t.view_src is not None else t.buffer
        with self._lock:
            self._put(key, _Entry(layout, crc, None if blocks else bits.copy(), values,
                                  weakref.ref(buffer) if buffer is not None else None))
        return values

    @staticmethod
    def _refresh(entry: _Entry, t: Tensor, raw: np.ndarray, bits: np.ndarray) -> None:
        """Bring an element-type entry up to date by converting only the elements that changed."""
        changed = bits != entry.bits
        if changed.any():
            entry.values.flags.writeable = True
            entry.values[changed] = T.to_float(t.type, raw[changed])
            entry.values.flags.writeable = False
            entry.bits[changed] = bits[changed]

    def _drop_dead(self) -> None:
        """Forget copies of memory that is gone (an unloaded model's weights): they can never hit again."""
        for key in [k for k, e in self._entries.items() if e.dead]:
            self._bytes -= self._entries.pop(key).nbytes

    def _put(self, key: tuple, entry: _Entry) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= old.nbytes
        if entry.nbytes > self.budget_bytes:
            return
        self._entries[key] = entry
        self._bytes += entry.nbytes
        while self._bytes > self.budget_bytes:
            _, evicted = self._entries.popitem(last=False)
            self._bytes -= evicted.nbytes


DEQUANT_CACHE = DequantCache()
