"""Load a GGUF file's tensors into backend buffers: zero copy where the device can wrap the mmap, else copied.

Like llama.cpp's loader, every tensor is created in a no_alloc Context with its GGUF type and shape.
Where the device offers `buffer_from_host_ptr` (the CPU device does), the mmap'ed file itself becomes
the WEIGHTS buffer and no byte is copied. Optionally quantized matrices are *repacked*: dequantized
once into F32 tensors of a separate buffer (what ggml's CPU_REPACK buffer type does with its own
layouts), so that the NumPy matmul runs straight on BLAS without dequantizing at every step.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from pyggml.backend import BufferUsage, tensor_alloc, tensor_set
from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.core import Context, GGMLType, Tensor
from pyggml.core import types as T
from pyggml.errors import GGMLError, GGUFError
from pyggml.models.gguf_file import GGUFFile


REPACK_ROWS = 16384


class Progress:
    """A one-line progress bar on stderr, drawn only on a terminal (or when forced)."""

    def __init__(self, label: str, total: int, enabled: bool | None = None):
        self.label, self.total, self.done = label, max(total, 1), 0
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self._last = 0.0

    def advance(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.enabled and (now - self._last > 0.1 or self.done >= self.total):
            self._last = now
            frac = min(self.done / self.total, 1.0)
            bar = "#" * int(frac * 30)
            sys.stderr.write(f"\r{self.label:<10} {frac * 100:5.1f}% [{bar:<30}]")
            if self.done >= self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


class Weights:
    """A model's tensors by GGUF name, placed in their buffers; `get` checks names and shapes for the architectures."""

    def __init__(self, gguf: GGUFFile, tensors: dict[str, Tensor], buffers: list):
        self.gguf = gguf
        self.tensors = tensors
        self.buffers = buffers

    @property
    def nbytes(self) -> int:
        return sum(b.size for b in self.buffers)

    def get(self, name: str, ne: tuple | None = None) -> Tensor:
        t = self.optional(name, ne)
        if t is None:
            raise GGUFError(f"{self.gguf.path}: tensor '{name}' is missing (the architecture needs it)")
        return t

    def optional(self, name: str, ne: tuple | None = None) -> Tensor | None:
        """The tensor or None; `ne` (None entries match any size) is checked when the tensor exists."""
        t = self.tensors.get(name)
        if t is not None and ne is not None:
            want = list(ne) + [1] * (4 - len(ne))
            if any(w is not None and w != have for w, have in zip(want, t.ne)):
                raise GGUFError(f"{self.gguf.path}: tensor '{name}' has shape {t.ne[:len(ne)]}, expected {list(ne)}")
        return t


def load_weights(gguf: GGUFFile, backend, repack: bool = False, progress: bool | None = None) -> Weights:
    """Create every tensor of `gguf` and put its data on `backend`'s device (see the module docstring)."""
    direct, packed = Context(no_alloc=True), Context(no_alloc=True)
    infos = {}
    for info in gguf.tensors:
        to_f32 = repack and T.is_quantized(int(info.type))
        ctx = packed if to_f32 else direct
        try:
            ctx.new_tensor(GGMLType.F32 if to_f32 else T.as_type(int(info.type)), info.ne[:info.n_dims] or (1,),
                           info.name)
        except GGMLError as e:
            raise GGUFError(f"{gguf.path}: tensor '{info.name}' ({info.type.name}{list(info.ne)}): {e}") from e
        infos[info.name] = info
    total = sum(infos[t.name].nbytes for t in direct) + sum(t.nbytes for t in packed)
    bar = Progress("loading", total, progress)
    buffers = [b for b in (_place_direct(gguf, backend, direct, infos, bar),
                           _place_repacked(gguf, backend, packed, infos, bar)) if b is not None]
    for b in buffers:
        b.usage = BufferUsage.WEIGHTS
    return Weights(gguf, {t.name: t for ctx in (direct, packed) for t in ctx}, buffers)


def _raw(gguf: GGUFFile, info) -> np.ndarray:
    return np.frombuffer(gguf.tensor_bytes(info), dtype=np.uint8)


def _place_direct(gguf: GGUFFile, backend, ctx: Context, infos: dict, bar: Progress):
    """The tensors kept in their file type: wrap the mapping where the device can, else allocate and copy."""
    if not len(ctx):
        return None
    device = backend.device
    if device.props().caps.buffer_from_host_ptr:
        largest = max(infos[t.name].nbytes for t in ctx)
        buf = device.buffer_from_host_ptr(gguf.buffer, gguf.file_size, largest)
        for t in ctx:
            tensor_alloc(buf, t, buf.base + infos[t.name].offset_in_file)
            bar.advance(infos[t.name].nbytes)
        return buf
    buf = alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
    for t in ctx:
        tensor_set(t, _raw(gguf, infos[t.name]))
        bar.advance(t.nbytes)
    return buf


def _place_repacked(gguf: GGUFFile, backend, ctx: Context, infos: dict, bar: Progress):
    """Quantized tensors dequantized once into F32 tensors of their own buffer, a slab of rows at a time
    (so a 262144-row embedding never needs a second full-size copy in memory)."""
    if not len(ctx):
        return None
    buf = alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
    for t in ctx:
        info = infos[t.name]
        file_type = T.as_type(int(info.type))
        rows = _raw(gguf, info).reshape(-1, T.row_size(file_type, info.ne[0]))
        f32_row = t.nb[1]
        for first in range(0, rows.shape[0], REPACK_ROWS):
            try:
                values = T.to_float(file_type, rows[first:first + REPACK_ROWS])
            except GGMLError as e:
                raise GGUFError(f"{gguf.path}: tensor '{t.name}' of type {file_type.name} cannot be repacked: {e}") from e
            tensor_set(t, np.ascontiguousarray(values, dtype=np.float32), first * f32_row, values.size * 4)
            gguf.release_pages(info.offset_in_file + first * rows.shape[1], rows[first:first + REPACK_ROWS].nbytes)
            bar.advance(values.size * 4)
    return buf
