"""A validating reader for GGUF files (versions 2 and 3), over an mmap of the file.

Every length and count is checked against the bytes the file still holds before
anything is allocated, so a corrupt or hostile file costs at most its own size.
Every problem raises ``GGUFError`` naming the field, its byte offset and what was
expected; no ``struct.error``, ``UnicodeDecodeError`` or ``MemoryError`` escapes.

Checks beyond ggml's own loader: metadata strings must be valid UTF-8, tensor data
must lie inside the file, be aligned and not overlap (ggml instead demands one exact
packed layout; a file packed that way always passes here).
"""

import contextlib
import mmap
import struct
from array import array
from dataclasses import dataclass
from enum import IntEnum
from itertools import pairwise
from pathlib import Path

import numpy as np

from pyggml.core.host_memory import whole_pages
from pyggml.core.jit import jit
from pyggml.core.types import GGMLType, block_traits
from pyggml.errors import GGUFError
from pyggml.models.gguf.string_table import StringTable

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4
MAX_NAME_LENGTH = 63  # GGML_MAX_NAME (64) less the terminating NUL
MAX_ARRAY_NESTING = 8
INT64_MAX = 2**63 - 1


class GGUFValueType(IntEnum):
    """A metadata value's type, as GGUF numbers it (the `gguf` package's enum of the same name, which
    tests/models/test_gguf_file.py holds this to, is not imported here: see pyggml.core.types)."""

    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size scalar types: struct format and size in bytes.
_SCALARS = {
    GGUFValueType.UINT8: "<B",
    GGUFValueType.INT8: "<b",
    GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I",
    GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f",
    GGUFValueType.BOOL: "<b",
    GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q",
    GGUFValueType.FLOAT64: "<d",
}
_NUMPY_DTYPES = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.BOOL: "<i1",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
}
# Fewest bytes one element of each type takes, to bound counts before allocating.
_MIN_SIZE = {t: struct.calcsize(f) for t, f in _SCALARS.items()}
_MIN_SIZE[GGUFValueType.STRING] = 8
_MIN_SIZE[GGUFValueType.ARRAY] = 12
_U64 = struct.Struct("<Q")
_MIN_KV_SIZE = 8 + 4 + 1  # empty key, type, smallest value
_MIN_TENSOR_INFO_SIZE = 8 + 4 + 4 + 8  # empty name, n_dims = 0, type, offset


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's header entry; ``ne`` is in ggml order (ne0 first), padded with 1 to 4 dims."""

    name: str
    type: GGMLType
    ne: tuple[int, int, int, int]
    n_dims: int
    offset_in_file: int
    nbytes: int


@dataclass(frozen=True)
class FieldType:
    """The GGUF type of a metadata value; for arrays also the element type (None for scalars)."""

    type: GGUFValueType
    element_type: GGUFValueType | None = None


@jit
def string_starts(buf: np.ndarray, pos: int, starts: np.ndarray) -> int:
    """The first byte of each of len(starts) GGUF strings (a little-endian uint64 length, then the bytes) from
    buf[pos], into starts; the position after the last one, or -1 where a length runs past the end of buf."""
    size = buf.size
    for i in range(starts.size):
        if size - pos < 8:
            return -1
        length = np.uint64(0)
        for b in range(8):
            length |= np.uint64(buf[pos + b]) << np.uint64(8 * b)
        pos += 8
        if length > np.uint64(size - pos):
            return -1
        starts[i] = pos
        pos += np.int64(length)
    return pos


@jit
def gather_strings(buf: np.ndarray, starts: np.ndarray, offsets: np.ndarray, blob: np.ndarray) -> None:
    """String i, at buf[starts[i]:], copied to blob[offsets[i]:offsets[i + 1]]."""
    for i in range(starts.size):  # byte by byte: a slice assignment compiled for 2 s, this for 0.1
        at, start = offsets[i], starts[i]
        for k in range(offsets[i + 1] - at):
            blob[at + k] = buf[start + k]


class _Cursor:
    """Reads little-endian values from a buffer, failing with the field name and offset."""

    def __init__(self, buf, path):
        self.buf = buf
        self.size = len(buf)
        self.pos = 0
        self.path = path

    def fail(self, field, what, offset=None):
        at = self.pos if offset is None else offset
        raise GGUFError(f"{self.path}: {field} at offset {at}: {what}")

    def remaining(self):
        return self.size - self.pos

    def need(self, field, n):
        if n > self.remaining():
            self.fail(field, f"needs {n} bytes but the file ends after {self.remaining()} (truncated)")

    def scalar(self, field, fmt):
        n = struct.calcsize(fmt)
        self.need(field, n)
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return value

    def u32(self, field):
        return self.scalar(field, "<I")

    def u64(self, field):
        return self.scalar(field, "<Q")

    def string(self, field):
        start = self.pos
        length = self.u64(f"{field} length")
        if length > self.remaining():
            self.fail(field, f"string length {length} exceeds the {self.remaining()} bytes left in the file", start)
        raw = bytes(self.buf[self.pos : self.pos + length])
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self.fail(field, f"invalid UTF-8 at byte {e.start} of the string ({e.reason})", self.pos)
        self.pos += length
        return text

    def count(self, field, min_element_size):
        """A u64 count that the rest of the file could possibly hold."""
        start = self.pos
        n = self.u64(field)
        if n * min_element_size > self.remaining():
            self.fail(field, f"count {n} needs at least {n * min_element_size} bytes, "
                      f"the file has {self.remaining()} left", start)
        return n

    def value_type(self, field):
        start = self.pos
        raw = self.u32(field)
        try:
            return GGUFValueType(raw)
        except ValueError:
            self.fail(field, f"unknown value type {raw} (expected 0..{int(max(GGUFValueType))})", start)

    def value(self, field, vtype, depth=0):
        if vtype == GGUFValueType.STRING:
            return self.string(field)
        if vtype == GGUFValueType.ARRAY:
            return self.array(field, depth + 1)
        value = self.scalar(field, _SCALARS[vtype])
        return bool(value) if vtype == GGUFValueType.BOOL else value

    def array(self, field, depth):
        if depth > MAX_ARRAY_NESTING:
            self.fail(field, f"arrays nested deeper than {MAX_ARRAY_NESTING} levels")
        etype = self.value_type(f"{field} element type")
        return self.array_items(field, etype, depth)

    def array_items(self, field, etype, depth):
        n = self.count(f"{field} element count", _MIN_SIZE[etype])
        if etype in _NUMPY_DTYPES:
            data = np.frombuffer(self.buf, dtype=_NUMPY_DTYPES[etype], count=n, offset=self.pos)
            self.pos += n * _MIN_SIZE[etype]
            values = data != 0 if etype == GGUFValueType.BOOL else data.copy()  # an array: a 262k-entry vocabulary's
            values.flags.writeable = False                                     # scores as Python floats took 8 MiB
            return values
        if etype == GGUFValueType.STRING:
            return self.strings(field, n)
        return [self.value(f"{field}[{i}]", etype, depth) for i in range(n)]

    def strings(self, field, n):
        """``n`` strings in a row, kept as one StringTable (a 262k-token vocabulary without a Python object per
        token), each checked to be UTF-8: found and gathered by compiled loops over their lengths and checked all
        at once (a vocabulary's 98k strings took 0.1 s one by one, 20 ms in a Python loop over the lengths); a
        file that fails is read one string at a time instead, for the error that names the string."""
        start = self.pos
        starts = self._string_starts(n)
        table = None if starts is None else self._utf8_table(starts)
        if table is None:
            self.pos = start
            return self._strings_one_by_one(field, n)
        return table

    def _utf8_table(self, starts):
        """The strings up to here whose text begins at `starts`, as a StringTable; None if one
        of them is not UTF-8 (no view of the file is left behind: a failed parse closes it)."""
        lengths = np.append(starts[1:] - 8, self.pos) - starts
        offsets = np.zeros(len(starts) + 1, np.int64)
        np.cumsum(lengths, out=offsets[1:])
        blob = np.empty(offsets[-1], np.uint8)
        gather_strings(np.frombuffer(self.buf, np.uint8), starts, offsets, blob)
        try:
            str(blob, "utf-8")  # the whole is UTF-8, and no string starts inside a character: each one is
        except UnicodeDecodeError:
            return None
        firsts = blob[offsets[:-1][lengths > 0]]
        return None if ((firsts & 0xC0) == 0x80).any() else StringTable(blob, offsets)

    def _string_starts(self, n):
        """The file positions of ``n`` length-prefixed strings from here, moving past them; None (and the
        position unmoved) where a length runs past the end of the file."""
        starts = np.empty(n, np.int64)
        end = string_starts(np.frombuffer(self.buf, np.uint8), self.pos, starts)
        if end < 0:
            return None
        self.pos = end
        return starts

    def _strings_one_by_one(self, field, n):
        """strings() one at a time: the first string that is cut short or not UTF-8 fails with its index."""
        buf, size, pos = self.buf, self.size, self.pos
        unpack_length = _U64.unpack_from
        blob = bytearray()
        offsets = array("q", [0])
        for i in range(n):
            self.pos = pos
            if pos + 8 > size:
                self.need(f"{field}[{i}] length", 8)
            (length,) = unpack_length(buf, pos)
            pos += 8
            if length > size - pos:
                self.fail(f"{field}[{i}]", f"string length {length} exceeds the {size - pos} bytes left in the file")
            raw = bytes(buf[pos : pos + length])
            try:
                str(raw, "utf-8")
            except UnicodeDecodeError as e:
                self.fail(f"{field}[{i}]", f"invalid UTF-8 at byte {e.start} of the string ({e.reason})", pos)
            blob += raw
            offsets.append(len(blob))
            pos += length
        self.pos = pos
        return StringTable(np.frombuffer(blob, np.uint8), np.frombuffer(offsets, np.int64))


class GGUFFile:
    """A parsed GGUF file: metadata, tensor infos, and zero-copy views of tensor data.

    Use as a context manager, or call ``close()``. Views from ``tensor_bytes`` stay
    valid after ``close()``: the mapping is released when the last view is dropped.
    """

    def __init__(self, path, buf, mm=None):
        self.path = str(path)
        self._mmap = mm
        self._buf = buf
        self.file_size = len(buf)
        self.metadata: dict[str, object] = {}
        self.field_types: dict[str, FieldType] = {}
        self.tensors: list[TensorInfo] = []
        self._parse()

    @classmethod
    def open(cls, path):
        """Map ``path`` read-only and parse it."""
        path = Path(path)
        try:
            with open(path, "rb") as f:
                size = path.stat().st_size
                if size == 0:
                    raise GGUFError(f"{path}: magic at offset 0: file is empty, expected 'GGUF'")
                mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise GGUFError(f"{path}: cannot open: {e.strerror}") from e
        view = memoryview(mm)
        try:
            return cls(path, view, mm)
        except BaseException:
            view.release()
            mm.close()
            raise

    @classmethod
    def from_bytes(cls, data, name="<bytes>"):
        """Parse a GGUF image held in memory (no mmap); handy for tests and network transfers."""
        return cls(name, memoryview(data).cast("B"))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        """Drop this object's hold on the mapping; live tensor views keep it mapped until freed."""
        if self._buf is None:
            return
        self._buf.release()
        self._buf = None
        if self._mmap is not None:
            with contextlib.suppress(BufferError):  # views from tensor_bytes still use it: it unmaps when they go
                self._mmap.close()
            self._mmap = None

    @property
    def closed(self):
        return self._buf is None

    # -- accessors --------------------------------------------------------

    def get(self, key, default=None):
        return self.metadata.get(key, default)

    def require(self, key, expected_type=None):
        """The value of ``key``; GGUFError if it is missing or (when given) of another GGUF type."""
        if key not in self.metadata:
            raise GGUFError(f"{self.path}: required metadata key '{key}' is missing")
        if expected_type is not None and self.field_types[key].type != expected_type:
            raise GGUFError(f"{self.path}: metadata key '{key}' has type {self.field_types[key].type.name}, "
                            f"expected {GGUFValueType(expected_type).name}")
        return self.metadata[key]

    @property
    def architecture(self):
        return self.require("general.architecture", GGUFValueType.STRING)

    def tensor(self, name):
        for info in self.tensors:
            if info.name == name:
                return info
        raise GGUFError(f"{self.path}: no tensor named '{name}'")

    def tensor_bytes(self, info):
        """The bytes of one tensor as a memoryview over the mapping (no copy)."""
        if self._buf is None:
            raise GGUFError(f"{self.path}: tensor '{info.name}' read after close()")
        return self._buf[info.offset_in_file : info.offset_in_file + info.nbytes]

    def release_pages(self, offset: int, size: int) -> None:
        """Let the OS drop this process's resident pages of bytes [offset, offset + size) of the file, e.g. a
        converted tensor's original bytes: they stop counting in RSS and are read again if touched (the
        mapping is read-only, so nothing is lost). Only whole pages inside the range are dropped."""
        if self._mmap is None or not hasattr(mmap, "MADV_DONTNEED"):
            return
        start, end = whole_pages(offset, min(offset + size, self.file_size) - offset)
        if end > start:
            self._mmap.madvise(mmap.MADV_DONTNEED, start, end - start)

    @property
    def buffer(self):
        """The whole file as a memoryview, e.g. to wrap in a host buffer without copying."""
        if self._buf is None:
            raise GGUFError(f"{self.path}: buffer used after close()")
        return self._buf

    # -- parsing ----------------------------------------------------------

    def _parse(self):
        cur = _Cursor(self._buf, self.path)
        self._parse_header(cur)
        self._parse_metadata(cur)
        self.alignment = self._alignment()
        infos = self._parse_tensor_infos(cur)
        self.data_offset = _pad(cur.pos, self.alignment)
        self.tensors = self._place_tensors(cur, infos)

    def _parse_header(self, cur):
        cur.need("magic", 4)
        magic = bytes(self._buf[0:4])
        if magic != GGUF_MAGIC:
            cur.fail("magic", f"found {magic!r}, expected {GGUF_MAGIC!r}")
        cur.pos = 4
        self.version = cur.u32("version")
        if self.version not in SUPPORTED_VERSIONS:
            hint = ""
            if self.version == 1:
                hint = " (GGUF v1 used 32-bit counts and is no longer supported)"
            elif self.version & 0xFFFF == 0:
                hint = " (looks byte-swapped: big-endian files are not supported)"
            cur.fail("version", f"version {self.version} is not supported, expected 2 or 3{hint}", 4)
        self.n_tensors = cur.count("tensor_count", _MIN_TENSOR_INFO_SIZE)
        self.n_kv = cur.count("metadata_kv_count", _MIN_KV_SIZE)

    def _parse_metadata(self, cur):
        for i in range(self.n_kv):
            start = cur.pos
            key = cur.string(f"metadata key #{i}")
            if key in self.metadata:
                cur.fail(f"metadata key #{i}", f"duplicate key '{key}'", start)
            vtype = cur.value_type(f"type of '{key}'")
            if vtype == GGUFValueType.ARRAY:
                etype = cur.value_type(f"element type of '{key}'")
                self.metadata[key] = cur.array_items(f"value of '{key}'", etype, 1)
            else:
                etype = None
                self.metadata[key] = cur.value(f"value of '{key}'", vtype)
            self.field_types[key] = FieldType(vtype, etype)

    def _alignment(self):
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        ftype = self.field_types["general.alignment"].type
        value = self.metadata["general.alignment"]
        if ftype != GGUFValueType.UINT32:
            raise GGUFError(f"{self.path}: general.alignment has type {ftype.name}, expected UINT32")
        if value == 0 or value & (value - 1):
            raise GGUFError(f"{self.path}: general.alignment is {value}, expected a power of two")
        return value

    def _parse_tensor_infos(self, cur):
        infos, names = [], set()
        for i in range(self.n_tensors):
            start = cur.pos
            name = cur.string(f"tensor #{i} name")
            field = f"tensor '{name}'"
            if len(name.encode("utf-8")) > MAX_NAME_LENGTH:
                cur.fail(f"tensor #{i} name", f"name is {len(name.encode())} bytes, ggml allows {MAX_NAME_LENGTH}",
                         start)
            if name in names:
                cur.fail(f"tensor #{i} name", f"duplicate tensor name '{name}'", start)
            names.add(name)
            dims_at = cur.pos
            n_dims = cur.u32(f"{field} n_dims")
            if n_dims > MAX_DIMS:
                cur.fail(f"{field} n_dims", f"{n_dims} dimensions, ggml allows at most {MAX_DIMS}", dims_at)
            ne = [1] * MAX_DIMS
            for d in range(n_dims):
                ne_at = cur.pos
                ne[d] = cur.scalar(f"{field} ne[{d}]", "<q")
                if ne[d] < 0:
                    cur.fail(f"{field} ne[{d}]", f"{ne[d]} elements, expected >= 0", ne_at)
            nelements = ne[0] * ne[1] * ne[2] * ne[3]
            if nelements > INT64_MAX:
                cur.fail(f"{field} ne", f"shape {tuple(ne)} has more than 2**63-1 elements", dims_at)
            type_at = cur.pos
            raw_type = cur.u32(f"{field} type")
            try:
                ttype = GGMLType(raw_type)
                block_size, type_size = block_traits(ttype)
            except ValueError:
                cur.fail(f"{field} type", f"unknown ggml type {raw_type}", type_at)
            if ne[0] % block_size:
                cur.fail(f"{field} ne[0]", f"{ne[0]} elements per row is not a multiple of "
                         f"{ttype.name}'s block size {block_size}", dims_at)
            offset_at = cur.pos
            offset = cur.u64(f"{field} offset")
            nbytes = nelements // block_size * type_size
            infos.append((name, ttype, tuple(ne), n_dims, offset, nbytes, offset_at))
        return infos

    def _place_tensors(self, cur, infos):
        if infos and self.data_offset > self.file_size:
            cur.fail("data section", f"starts at {self.data_offset}, past the end of the "
                     f"{self.file_size}-byte file (truncated)", self.data_offset)
        tensors = []
        for name, ttype, ne, n_dims, offset, nbytes, offset_at in infos:
            field = f"tensor '{name}' offset"
            if offset % self.alignment:
                cur.fail(field, f"data offset {offset} is not a multiple of the alignment {self.alignment}", offset_at)
            start = self.data_offset + offset
            if start + nbytes > self.file_size:
                cur.fail(field, f"data [{start}, {start + nbytes}) runs past the end of the "
                         f"{self.file_size}-byte file", offset_at)
            tensors.append(TensorInfo(name, ttype, ne, n_dims, start, nbytes))
        by_start = sorted(tensors, key=lambda t: (t.offset_in_file, t.nbytes))
        for prev, nxt in pairwise(by_start):
            if nxt.offset_in_file < prev.offset_in_file + prev.nbytes and nxt.nbytes and prev.nbytes:
                raise GGUFError(f"{self.path}: tensor '{nxt.name}' data at offset {nxt.offset_in_file} "
                                f"overlaps tensor '{prev.name}' [{prev.offset_in_file}, "
                                f"{prev.offset_in_file + prev.nbytes})")
        return tensors


def _pad(n, alignment):
    return (n + alignment - 1) // alignment * alignment
