"""The compiled kernels' disk cache, loaded early: every kernel a model's tensor types need, before its weights.

Numba loads a cached kernel at its first call; a model asks for them all at once instead (through its backend's
"load_kernels" extension), while it is still small (see load_cached). Where the cache is kept, and when it is
stale, is pyggml.core.jit's business.
"""

from __future__ import annotations

import contextlib
from typing import Iterable

from llvmlite.binding import ffi
from numba.core.compiler_lock import global_compiler_lock


def shared_kernels() -> list:
    """The kernels the CPU backend's ops call from Python whatever the types (their callees compile into them)."""
    from pyggml.backend.cpu.jit import attention, glu, mul_mat, norm, rope, softmax
    return [mul_mat.mul_mat_float_columns, softmax.soft_max_rows, rope.rope_rows, attention.exp_score_rows,
            attention.flash_attn_rows, glu.glu_rows, glu.unary_rows, norm.norm_rows, norm.rms_norm_rows]


def type_kernels(qtypes: Iterable[int] | None) -> list:
    """The kernels that tensors of these ggml types (None: every type) may call: products and row reads, the
    repack and activation quantizers of the types that are interleaved, and row writes (a KV cache's) into
    them. A kernel left out still loads from the cache at its first call (a warm start's 17 kernels loaded in
    0.13-0.2 s, some of them for types the model did not have)."""
    from pyggml.backend.cpu.jit import mul_mat, quants, repack, rows
    from pyggml.backend.cpu.jit.ir.amx_ir import SUB_BLOCKS, amx_usable
    from pyggml.backend.cpu.jit.ir.vnni_ir import FORMATS
    from pyggml.backend.cpu.jit.ir.vnni_k_ir import K_FORMATS
    from pyggml.core.types import GGMLType

    set_rows = {GGMLType.F32: rows.set_rows_f32, GGMLType.F16: rows.set_rows_f16, GGMLType.Q8_0: rows.set_rows_q8_0,
                GGMLType.Q4_0: rows.set_rows_q4_0}
    found = []
    qtypes = sorted(set(map(int, [*quants.BLOCKS, *set_rows] if qtypes is None else qtypes)))
    if any(qtype in FORMATS or qtype in K_FORMATS for qtype in qtypes):
        found.append(repack.repack_groups)  # what the loader interleaves these types' weights with
    if any(qtype in FORMATS for qtype in qtypes):
        found += [repack.quantize_q8_0_rows, repack.quantize_q8_0_parallel]
    if any(qtype in K_FORMATS for qtype in qtypes):
        found += [repack.quantize_q8_K_rows, repack.quantize_q8_K_parallel]
    for qtype in qtypes:
        if qtype in quants.BLOCKS:
            found += [mul_mat.mul_mat_vec[qtype], mul_mat.dequantize_rows[qtype]]
        if qtype in FORMATS:
            found.append(repack.gemm_16x4_q8_0[qtype])
        if qtype in K_FORMATS:
            found.append(repack.gemm_16x4_q8_K[qtype])
        if qtype in SUB_BLOCKS and amx_usable():
            found.append(repack.gemm_amx[qtype])
        if qtype in set_rows:
            found.append(set_rows[qtype])
    return found


def load_kernels(qtypes: Iterable[int] | None = None) -> int:
    """Load now the cached kernels that tensors of these ggml types (None: every type) use (see load_cached);
    returns how many."""
    return load_cached(shared_kernels() + type_kernels(qtypes))


def load_cached(dispatchers: list) -> int:
    """Load now every signature the disk cache holds for the dispatchers, instead of at each one's first call.

    Models call this before they read their weights: a load needs LLVM, whose pages the process gives
    back afterwards (compiler_pages), so LLVM is then resident while the process is small, not at a first
    generation step with all the weights resident (about 12 MiB more peak RSS). They go back once, after
    the last load, not after each (a 1B file's kernels: /proc/self/smaps read and parsed 12 times, and LLVM's
    pages faulted back 11 times: 0.6 s to load them, 0.5 s so). Entries made for other sources, another type
    or another CPU are left alone; returns the number of kernels loaded.
    """
    loaded = 0
    # held across the loads: LLVM's pages are handed back once, after the last
    with global_compiler_lock, llvm_lock_events_off():
        for d in dispatchers:
            try:
                cache = d._cache
                index = cache._cache_file._load_index()
            except AttributeError:
                continue  # not a caching dispatcher, or Numba's cache layout is not the known one
            if not index:
                continue
            codegen = d.targetctx.codegen()
            for key in index:
                args = key[0]
                if tuple(args) not in d.overloads and key == cache._index_key(args, codegen):
                    d.compile(args)
                    loaded += 1
    return loaded


@contextlib.contextmanager
def llvm_lock_events_off():
    """Numba's callbacks on llvmlite's lock left out for a while (held with Numba's compiler lock): every call
    into LLVM takes that lock, and Numba's callbacks broadcast a "numba:llvm_lock" event at each take and
    release, which only times the lock for a compile's metadata (3400 calls for a small model's 18 kernels:
    10-15 ms of a 0.13 s load). No compile runs meanwhile: it needs the compiler lock."""
    lock = getattr(getattr(ffi, "lib", None), "_lock", None)
    callbacks = getattr(lock, "_cblist", None)
    if not isinstance(callbacks, list):  # not the llvmlite this knows: its lock as it is
        yield
        return
    lock._cblist = []
    try:
        yield
    finally:
        lock._cblist = callbacks
