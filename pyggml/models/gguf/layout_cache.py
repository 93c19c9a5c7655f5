"""A GGUF file's interleaved matrices kept on disk, so that a later load maps them instead of repacking them.

Why: repacking writes the whole interleaved buffer into fresh memory (an 8B Q4_K_M file: 4.9 GB), and on a virtual
machine whose host takes freed memory back, a page first written after another process freed its memory is faulted
in on the host too: the 8B file's weights took 3.5-6.8 s to repack right after llama.cpp's process ended, 1.7 s when
the host still held the pages. Mapped from a file in the page cache, no page is fresh: the whole load took 0.6 s.
llama.cpp maps its file's own layout the same way, and ik_llama.cpp maps files repacked offline.

The first load of a file repacks it into a new entry's file, mapped shared (`Incoming`), so the buffer is that file's
page cache and nothing is copied; the file is flushed to the disk in the background and renamed when whole (at exit
the process waits for that). Later loads map the entry read-only. One file an entry: a header (JSON: the source
file's identity, the layout's version and every tensor's name, type, shape and place) in whole units of 64 KiB,
then the buffer's bytes.
An entry is used only when its header matches exactly and the first and last row group of every tensor equal a
fresh repack of the source's; else it is deleted and the file repacked. A new entry replaces those of the same
source file's older versions. Where: $PYGGML_WEIGHTS_CACHE ("off" turns it off), else
$XDG_CACHE_HOME/pyggml/weights (~/.cache/pyggml/weights); at most $PYGGML_WEIGHTS_CACHE_GB GiB (default 64), the
least recently used entries deleted first, and never filling the disk (a tenth of it, at least 1 GiB, is left
free). Buffers under 64 MiB
repack in milliseconds and are not kept.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import mmap
import os
import shutil
import sys
import threading
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pyggml.core.host_memory import map_for_reading
from pyggml.errors import ParameterError

CACHE_ENV = "PYGGML_WEIGHTS_CACHE"
CAP_ENV = "PYGGML_WEIGHTS_CACHE_GB"
DEFAULT_CAP_GIB = 64
MIN_BYTES = 64 << 20
FREE_DISK_SHARE, FREE_DISK_MIN = 0.1, 1 << 30  # what an entry leaves free of its disk: a tenth, at least 1 GiB
HEADER_BYTES = 1 << 16  # the header takes whole units of this (pages): the buffer's bytes map directly after it
MAGIC = b"pyggml interleaved weights\n"
READ_AHEAD_PIECE = 8 << 20
SUFFIX = ".weights"


def cache_dir() -> Path | None:
    """Where entries are kept, or None when the cache is off ($PYGGML_WEIGHTS_CACHE=off) or the platform lacks
    posix_fallocate (entries are made full size before they are written)."""
    value = os.environ.get(CACHE_ENV, "")
    if value.lower() in ("off", "0", "none", "false") or not hasattr(os, "posix_fallocate"):
        return None
    if value:
        return Path(value)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pyggml" / "weights"


def cap_bytes() -> int:
    """The cache's size limit in bytes ($PYGGML_WEIGHTS_CACHE_GB, default 64 GiB)."""
    value = os.environ.get(CAP_ENV)
    try:
        return int(float(value) * (1 << 30)) if value else DEFAULT_CAP_GIB << 30
    except ValueError:
        raise ParameterError(f"{CAP_ENV} must be a number of GiB, got {value!r}") from None


@dataclass(frozen=True)
class Placed:
    """One interleaved tensor and where its bytes lie in the buffer."""
    name: str
    type: int
    ne: tuple[int, ...]
    offset: int
    nbytes: int


class Entry:
    """The cache entry of one GGUF file's interleaved buffer (`size` bytes, tensors `placed`, in the buffer type's
    layout version `layout`)."""

    def __init__(self, source: str, placed: list[Placed], size: int, layout: str):
        st = os.stat(source)
        self.placed, self.size, self.source = placed, size, os.path.realpath(source)
        facts = {"source": self.source, "bytes": st.st_size, "mtime_ns": st.st_mtime_ns,
                 "inode": st.st_ino, "device": st.st_dev, "layout": layout, "size": size,
                 "tensors": [[p.name, p.type, list(p.ne), p.offset, p.nbytes] for p in placed]}
        text = json.dumps(facts, sort_keys=True).encode()
        self.header = MAGIC + text + b"\n"
        self.header_bytes = -(-len(self.header) // HEADER_BYTES) * HEADER_BYTES  # where the buffer's bytes start
        self.key = hashlib.sha256(text).hexdigest()[:32]

    def path(self, directory: Path) -> Path:
        return directory / (self.key + SUFFIX)

    def open(self, directory: Path, expected) -> np.ndarray | None:
        """The cached buffer, mapped read-only, or None when there is none or it does not check (then it is
        deleted). `expected(placed)` gives (offset in the tensor, bytes) pairs that a tensor's bytes must hold:
        the loader's fresh conversion of its first and last row group."""
        path = self.path(directory)
        try:
            with open(path, "rb") as f:
                if os.fstat(f.fileno()).st_size != self.header_bytes + self.size or \
                        f.read(len(self.header)) != self.header:
                    raise ValueError("stale")
                read_ahead(f.fileno(), self.header_bytes + self.size)
                mm = mmap.mmap(f.fileno(), self.header_bytes + self.size, access=mmap.ACCESS_READ)
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            _remove(path)
            return None
        array = np.frombuffer(mm, np.uint8, count=self.size, offset=self.header_bytes)
        map_for_reading(array)
        if not all(np.array_equal(array[p.offset + start: p.offset + start + len(want)], want)
                   for p in self.placed for start, want in expected(p)):
            del array
            mm.close()
            _remove(path)
            return None
        with contextlib.suppress(OSError):
            os.utime(path)  # the most recently used entry is the last to go (evict)
        return array


def _remove(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def entries(directory: Path) -> list[Path]:
    """The directory's entries, least recently used first."""
    with contextlib.suppress(OSError):
        found = [p for p in directory.iterdir() if p.name.endswith(SUFFIX)]
        return sorted(found, key=lambda p: p.stat().st_mtime_ns if p.exists() else 0)
    return []


def make_room(directory: Path, size: int) -> bool:
    """Delete the least recently used entries until `size` more bytes fit under the cap and leave a tenth of the
    disk (at least FREE_DISK_MIN) free; False when they cannot (the entry is then not written)."""
    if size > cap_bytes():
        return False
    kept = entries(directory)
    total = sum(p.stat().st_size for p in kept if p.exists())

    def disk_short() -> bool:
        usage = shutil.disk_usage(directory)
        return usage.free - size < max(FREE_DISK_MIN, FREE_DISK_SHARE * usage.total)

    while kept and (total + size > cap_bytes() or disk_short()):
        oldest = kept.pop(0)
        with contextlib.suppress(OSError):
            total -= oldest.stat().st_size
        _remove(oldest)
    return total + size <= cap_bytes() and not disk_short()


def read_ahead(fd: int, size: int) -> None:
    """Have the kernel read the file into the page cache, a piece at a time (one request reads at most the
    device's read-ahead, 8 MiB here): a 4.9 GB entry not in the page cache in 1.8 s, where the page faults of
    mapping it took 2.6 s; pieces already cached cost a look (0.02 s for all of it)."""
    if not hasattr(os, "posix_fadvise"):
        return
    for start in range(0, size, READ_AHEAD_PIECE):
        with contextlib.suppress(OSError):
            os.posix_fadvise(fd, start, READ_AHEAD_PIECE, os.POSIX_FADV_WILLNEED)


def header_facts(path: Path) -> dict | None:
    """The JSON facts of an entry's header (source, bytes, mtime_ns, inode, device, layout, size, tensors), or None
    for a file that is not a readable entry."""
    try:
        with open(path, "rb") as f:
            if f.readline() != MAGIC:
                return None
            return json.loads(f.readline())
    except (OSError, ValueError):
        return None


def source_unchanged(facts: dict) -> bool:
    """Whether the entry's source file is still the one it was made from (same path, size, time and inode)."""
    try:
        st = os.stat(facts["source"])
    except (OSError, KeyError):
        return False
    return (st.st_size, st.st_mtime_ns, st.st_ino) == (facts.get("bytes"), facts.get("mtime_ns"), facts.get("inode"))


def _remove_older_versions(directory: Path, entry: Entry) -> None:
    """Delete the entries of entry's source file made from another version of it (or of the layout): their keys
    differ, so nothing would read them again."""
    for p in entries(directory):
        facts = header_facts(p)
        if facts is not None and facts.get("source") == entry.source and p != entry.path(directory):
            _remove(p)


def clear(directory: Path) -> tuple[int, int]:
    """Delete every entry, and partial ones of processes that are gone: (entries deleted, their bytes)."""
    count = total = 0
    for p in entries(directory):
        with contextlib.suppress(OSError):
            total += p.stat().st_size
            p.unlink()
            count += 1
    if directory.is_dir():
        _stale_incoming(directory)
    return count, total


def _stale_incoming(directory: Path) -> None:
    """Remove partial entries left by a process that was killed while writing (their pid is gone)."""
    for p in directory.glob(".incoming-*"):
        try:
            os.kill(int(p.name.split("-")[1]), 0)
        except (ProcessLookupError, ValueError, IndexError):
            _remove(p)
        except OSError:
            pass


class Incoming:
    """An entry being made: a temporary file of the entry's size (its blocks allocated up front, so a full disk
    fails here, not as a fault on a page later), mapped shared, that the loader repacks into, so the buffer is the
    entry's page cache and nothing is copied; `commit` then writes the header and, in the background, flushes the
    file to the disk and renames it: a reader sees a whole entry or none. At exit the process waits for that with a
    note on stderr (KeyboardInterrupt leaves the partial file, removed by the next entry's writer)."""

    def __init__(self, entry: Entry, directory: Path, path: Path, fd: int, mm: mmap.mmap):
        self.entry, self.directory, self.path, self.fd, self.mm = entry, directory, path, fd, mm
        self.array = np.frombuffer(mm, np.uint8, count=entry.size, offset=entry.header_bytes)
        self.thread: threading.Thread | None = None
        self.error: OSError | None = None

    @classmethod
    def create(cls, entry: Entry, directory: Path) -> Incoming | None:
        """The file for `entry`, or None when the cache cannot take it (no room under the cap or on the disk, a
        file system error): the loader then repacks into its own memory."""
        path = directory / f".incoming-{os.getpid()}-{entry.key}"
        total = entry.header_bytes + entry.size
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _stale_incoming(directory)
            _remove_older_versions(directory, entry)
            if not make_room(directory, total):
                return None
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError:
            return None
        try:
            os.posix_fallocate(fd, 0, total)
            return cls(entry, directory, path, fd, mmap.mmap(fd, total, mmap.MAP_SHARED))
        except (OSError, AttributeError):
            os.close(fd)
            _remove(path)
            return None

    def commit(self) -> None:
        """The repack is done: the header, then flush and rename in the background."""
        self.array.flags.writeable = False
        os.pwrite(self.fd, self.entry.header, 0)
        self.thread = threading.Thread(target=self._flush, name="pyggml-layout-cache", daemon=True)
        if not _pending:
            atexit.register(finish_writes)
        _pending.append(self)
        self.thread.start()

    def abandon(self) -> None:
        """The load failed: no entry."""
        os.close(self.fd)
        _remove(self.path)

    def _flush(self) -> None:
        with contextlib.suppress(OSError, AttributeError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: this thread's nice value
        try:
            os.fdatasync(self.fd)
            os.replace(self.path, self.entry.path(self.directory))
        except OSError as e:  # a cache: the model runs on from its mapping; the next load repacks again
            self.error = e
            _remove(self.path)
            warnings.warn(f"pyggml: the interleaved weights were not kept in {self.directory}: {e}", RuntimeWarning,
                          stacklevel=1)
        finally:
            os.close(self.fd)
            self.array = self.mm = None  # the buffer's own view keeps the mapping while the model lives

    def finish(self) -> None:
        """Wait for the flush (at exit), saying so on stderr; KeyboardInterrupt stops waiting."""
        if self.thread is None or not self.thread.is_alive():
            return
        print(f"pyggml: keeping the interleaved weights on disk for faster loads ({self.entry.size >> 20} MiB, once; "
              f"{CACHE_ENV}=off turns it off)", file=sys.stderr, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            self.thread.join()


_pending: list[Incoming] = []


def finish_writes() -> None:
    """Wait for the entries still being flushed (atexit)."""
    while _pending:
        _pending.pop(0).finish()
