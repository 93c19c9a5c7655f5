"""`pyggml cache`: what pyggml keeps on disk between runs, the interleaved weights of the loader's layout cache
(pyggml.models.gguf.layout_cache) and the compiled kernels, with their sizes; `--clear` deletes them (the next load
repacks its file, the next run compiles its kernels again)."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

MIB = 1024 * 1024


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("cache", help="show or clear the interleaved weights and compiled kernels kept on disk")
    p.add_argument("--clear", choices=["weights", "kernels", "all"],
                   help="delete the weights' entries, the compiled kernels, or both (made again when next needed)")
    p.set_defaults(run=run)


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) if folder.is_dir() else 0


def run(args) -> int:
    from pyggml.core.jit import cache_root
    from pyggml.models.gguf import layout_cache

    weights, kernels = layout_cache.cache_dir(), cache_root()
    if args.clear in ("weights", "all") and weights is not None:
        count, freed = layout_cache.clear(weights)
        print(f"deleted {count} interleaved weights entr{'y' if count == 1 else 'ies'} ({freed / MIB:.1f} MiB)")
    if args.clear in ("kernels", "all"):
        freed = folder_bytes(kernels)
        shutil.rmtree(kernels, ignore_errors=True)
        print(f"deleted the compiled kernels ({freed / MIB:.1f} MiB)")
    if weights is None:
        print(f"interleaved weights: not kept ({layout_cache.CACHE_ENV}=off)")
    else:
        found = [(p, p.stat()) for p in layout_cache.entries(weights)]
        total = sum(st.st_size for _, st in found)
        print(f"interleaved weights: {weights} ({len(found)} entr{'y' if len(found) == 1 else 'ies'}, "
              f"{total / MIB:.1f} MiB of at most {layout_cache.cap_bytes() / MIB:.0f} MiB)")
        for p, st in reversed(found):  # the most recently used first
            facts = layout_cache.header_facts(p) or {}
            used = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.st_mtime))
            state = "" if layout_cache.source_unchanged(facts) else "  (its file has changed or is gone)"
            print(f"  {st.st_size / MIB:9.1f} MiB  used {used}  {facts.get('source', '?')}{state}")
    print(f"compiled kernels: {kernels} ({folder_bytes(kernels) / MIB:.1f} MiB)")
    return 0
