"""LLVM's code pages, handed back to the kernel after each kernel load.

Numba needs LLVM (llvmlite's 170 MB library) only while it compiles a kernel or loads one from its disk
cache; the kernels then run as plain machine code. Yet the pages LLVM touched for that stay resident: on
a 85 MB model file about 68 MiB of the process's peak RSS was LLVM's code and tables, a quarter of it.
So when Numba's compiler lock is released (every compile and cache load holds it), the read-only file
mappings of llvmlite's library are advised MADV_DONTNEED: their pages leave the process and fault back
from the page cache, unchanged, if LLVM runs again (a later kernel load touches about 12 MiB of them).

Only mappings that cannot hold private data are advised: not writable, and with no anonymous or swapped
pages (a copy-on-write page, such as the relocated `.data.rel.ro`, would be lost). Linux only; elsewhere,
or where /proc cannot be read, nothing is done.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass

from pyggml.core.host_memory import madvise

LIBRARY = "libllvmlite"


@dataclass
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    anonymous_kib: int = 0
    swap_kib: int = 0
    rss_kib: int = 0

    @property
    def holds_only_file_pages(self) -> bool:
        """Its resident pages equal the file's: dropping them loses nothing."""
        return "w" not in self.perms and self.anonymous_kib == 0 and self.swap_kib == 0


def parse_smaps(text: str) -> list[Mapping]:
    """The mappings of a /proc/<pid>/smaps text, with the counts this module needs."""
    mappings: list[Mapping] = []
    fields = {"Anonymous:": "anonymous_kib", "Swap:": "swap_kib", "Rss:": "rss_kib"}
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] in fields and mappings:
            setattr(mappings[-1], fields[parts[0]], int(parts[1]))
        elif "-" in parts[0] and not parts[0].endswith(":"):
            start, end = (int(x, 16) for x in parts[0].split("-"))
            mappings.append(Mapping(start, end, parts[1], parts[5] if len(parts) > 5 else ""))
    return mappings


def compiler_mappings() -> list[Mapping]:
    try:
        with open("/proc/self/smaps") as f:
            return [m for m in parse_smaps(f.read()) if LIBRARY in m.path]
    except OSError:
        return []


_releasable: list[Mapping] = []  # found once: a mapping that is not writable never gains private pages


def release_compiler_pages() -> int:
    """Advise away the pages of LLVM's read-only file mappings; returns the KiB advised.

    The mappings are read from /proc/self/smaps once: reading and parsing it at every compile's end (14 in a
    first run) took 0.2 s of CPU."""
    if not _releasable:
        _releasable.extend(m for m in compiler_mappings() if m.holds_only_file_pages)
    released = 0
    for m in _releasable:
        if madvise(m.start, m.end - m.start, mmap.MADV_DONTNEED):
            released += (m.end - m.start) // 1024
    return released


def install() -> None:
    """Release LLVM's pages whenever a thread leaves Numba's compiler lock (a compile or a cache load).

    Called once, when the kernels' package is imported."""
    from numba.core import event
    from numba.core.compiler_lock import global_compiler_lock

    class ReleaseAfterCompile(event.Listener):
        def on_start(self, ev) -> None:
            pass

        def on_end(self, ev) -> None:
            if not global_compiler_lock.is_locked():  # the outermost release: nested compiles are done
                release_compiler_pages()

    event.register("numba:compiler_lock", ReleaseAfterCompile())
