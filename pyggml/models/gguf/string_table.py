"""Many strings kept as one block of UTF-8 bytes: a GGUF vocabulary without a Python object per token.

Gemma 3's 262,144 tokens as Python strings, in a list and a str -> id dict, took about 40 MiB; here they
are the bytes (2 MiB), their offsets and a sorted table of their hashes (2 MiB each). A string is decoded
when it is asked for; `ids` finds a string's index by its hash (binary search, then a comparison), about
a microsecond against a dict's tenth, which tokenizing a prompt does a few thousand times.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import pairwise

import numpy as np

from pyggml.core.jit import jit


FNV_OFFSET, FNV_PRIME = np.uint64(0xCBF29CE484222325), np.uint64(0x100000001B3)


@jit
def fnv1a(data, start: int, end: int) -> np.uint64:
    """64-bit FNV-1a of the bytes data[start:end]: a hash of a string's UTF-8 bytes that compiled code computes
    for a whole vocabulary at once (Python's hash of each decoded string took 40 ms of a 128k-token load)."""
    h = FNV_OFFSET
    for k in range(start, end):
        h = (h ^ np.uint64(data[k])) * FNV_PRIME
    return h


@jit
def fnv1a_hashes(blob: np.ndarray, offsets: np.ndarray, out: np.ndarray) -> None:
    """out[i] = fnv1a of string i, blob[offsets[i]:offsets[i + 1]]."""
    for i in range(out.size):
        out[i] = fnv1a(blob, offsets[i], offsets[i + 1])


@jit
def first_with_hash(data: bytes, sorted_hashes: np.ndarray) -> int:
    """The first position in sorted_hashes of fnv1a(data), or -1 (one call for a lookup's hash and search; the
    binary search written out: NumPy's searchsorted took 0.4 s of a first run's compiling)."""
    h = fnv1a(data, 0, len(data))
    lo, hi = 0, sorted_hashes.size
    while lo < hi:
        mid = (lo + hi) // 2
        if sorted_hashes[mid] < h:
            lo = mid + 1
        else:
            hi = mid
    return lo if lo < sorted_hashes.size and sorted_hashes[lo] == h else -1


class StringTable(Sequence):
    """An immutable sequence of str: string i is the UTF-8 bytes blob[offsets[i]:offsets[i + 1]]."""

    def __init__(self, blob: np.ndarray, offsets: np.ndarray):
        self._blob = blob
        self._offsets = offsets
        self._hashes: np.ndarray | None = None  # sorted hashes and the index of each: built on first lookup
        self._order: np.ndarray | None = None

    @classmethod
    def from_strings(cls, strings: Iterable[str]) -> StringTable:
        encoded = [s.encode("utf-8") for s in strings]
        offsets = np.zeros(len(encoded) + 1, np.int64)
        np.cumsum([len(b) for b in encoded], out=offsets[1:])
        return cls(np.frombuffer(b"".join(encoded), np.uint8), offsets)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(f"string {i} of a table of {n}")
        i %= n
        return self._blob[self._offsets[i]: self._offsets[i + 1]].tobytes().decode("utf-8")

    def __iter__(self) -> Iterator[str]:
        blob, offsets = self._blob.tobytes(), self._offsets.tolist()
        for start, end in pairwise(offsets):
            yield blob[start:end].decode("utf-8")

    def __eq__(self, other) -> bool:
        if isinstance(other, (StringTable, list, tuple)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None

    def __repr__(self) -> str:
        return f"StringTable({len(self)} strings)"

    def tolist(self) -> list[str]:
        return list(self)

    def lengths(self) -> np.ndarray:
        """Each string's length in UTF-8 bytes."""
        return np.diff(self._offsets)

    @property
    def ids(self) -> "StringIds":
        """The table as a mapping from string to index (the first index for a string that repeats)."""
        return StringIds(self)

    def _index(self) -> None:
        if self._hashes is None:
            hashes = np.empty(len(self), np.uint64)
            fnv1a_hashes(self._blob, self._offsets, hashes)
            self._order = np.argsort(hashes, kind="stable")  # equal hashes stay in index order
            self._hashes = hashes[self._order]

    def index_of(self, s: str) -> int | None:
        """The first index of s, or None."""
        self._index()
        k = first_with_hash(s.encode("utf-8"), self._hashes)
        if k < 0:
            return None
        h = self._hashes[k]
        while k < len(self._hashes) and self._hashes[k] == h:  # the strings of that hash: one, or a collision
            i = int(self._order[k])
            if self[i] == s:
                return i
            k += 1
        return None

    def __contains__(self, s) -> bool:
        return isinstance(s, str) and self.index_of(s) is not None

    def first_repeat(self) -> tuple[int, int] | None:
        """(an index, the earlier index holding the same string) for a string that repeats, or None."""
        self._index()
        steps = np.diff(self._hashes)
        if steps.all():
            return None  # no two hashes equal: the common case, decided without splitting into runs
        starts = np.flatnonzero(steps != 0) + 1
        for run in np.split(self._order, starts):  # indices of equal hashes: repeats, or (rarely) collisions
            if len(run) > 1:
                strings = {}
                for i in sorted(run.tolist()):
                    if self[i] in strings:
                        return i, strings[self[i]]
                    strings[self[i]] = i
        return None


class StringIds(Mapping):
    """str -> index of a StringTable, as a dict would answer (KeyError for a string not in the table)."""

    def __init__(self, table: StringTable):
        self._table = table

    def __getitem__(self, s: str) -> int:
        i = self._table.index_of(s) if isinstance(s, str) else None
        if i is None:
            raise KeyError(s)
        return i

    def get(self, s, default=None):
        i = self._table.index_of(s) if isinstance(s, str) else None
        return default if i is None else i

    def __contains__(self, s) -> bool:
        return s in self._table

    def __iter__(self) -> Iterator[str]:
        return iter(self._table)

    def __len__(self) -> int:
        return len(self._table)
