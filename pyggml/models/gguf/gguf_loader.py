"""Load a GGUF file's tensors into backend buffers: zero copy where the device can wrap the mmap, else copied.

Like llama.cpp's loader, every tensor is created in a no_alloc Context with its GGUF type and shape.
Where the device offers `buffer_from_host_ptr` (the CPU device does), the mmap'ed file's data section
itself becomes the WEIGHTS buffer and no byte is copied: the CPU's compiled kernels multiply quantized
weights in their block formats there. Optionally (`weights="f32"`, `pyggml generate --weights f32`)
quantized tensors are *expanded*: placed, with their own types, in the device's float32 extra buffer type
(the CPU's "CPU_F32"), which keeps their float32 values (4 bytes a weight; products run on BLAS). By
default, the matrices an extra buffer type `takes` go there instead (the CPU's "CPU_INTERLEAVED": Q4_0,
Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K .. Q6_K and IQ4_XS interleaved for the integer products, same bytes),
except an untied token embedding, whose rows GET_ROWS reads from the file (a tied one is the output head
too, and goes with the layers): all of a model's layer matrices or none. The integer products quantize
their activations to Q8_0 (Q8_K) as ggml does; a model whose layers mixed them with float products (Gemma 3
270M Q4_K_M's Q4_K and Q6_K before they had integer kernels here) moved
further from llama.cpp's logits than with either alone (mean KLD 1.17 times llama.cpp's F32-weights
yardstick, against 1.00 all float), as llama.cpp quantizes the activations of every product.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import numpy as np

from pyggml.backend import BufferUsage, tensor_alloc, tensor_set
from pyggml.alloc import alloc_ctx_tensors_from_buft
from pyggml.core import Context, Tensor
from pyggml.core import types as T
from pyggml.errors import GGMLError, GGUFError
from pyggml.models.gguf import layout_cache
from pyggml.models.gguf.gguf_file import GGUFFile

if TYPE_CHECKING:
    from tqdm import tqdm


CONVERT_ROWS = 16384  # rows a slab written into a converting buffer type
WEIGHT_KINDS = ("quantized", "f32")
INPUT_EMBEDDING = "token_embd.weight"  # read by GET_ROWS: stays in the file's layout unless it is the output too
OUTPUT = "output.weight"


class Weights:
    """A model's tensors by GGUF name, placed in their buffers; `get` checks names and shapes for the architectures."""

    def __init__(self, gguf: GGUFFile, tensors: dict[str, Tensor], buffers: list):
        self.gguf = gguf
        self.tensors = tensors
        self.buffers = buffers
        self.asked: set[str] = set()   # the names an architecture looked up (see check_all_asked)

    @property
    def nbytes(self) -> int:
        """Bytes the weights take in their buffers: their file bytes where the file is mapped, their
        allocation elsewhere (a tensor left for another backend counts nothing)."""
        return sum(t.buffer.buft.alloc_size(t) for t in self.tensors.values() if t.buffer is not None)

    @property
    def file_tensor_bytes(self) -> int:
        """Bytes the GGUF file's tensors take in it (what llama.cpp keeps in memory for them)."""
        return sum(info.nbytes for info in self.gguf.tensors)

    def file_bytes(self, t: Tensor) -> np.ndarray:
        """The bytes the file holds for weight t (a converted tensor's own bytes cannot be read back)."""
        return _raw(self.gguf, self.gguf.tensor(t.name))

    def get(self, name: str, ne: tuple | None = None) -> Tensor:
        t = self.optional(name, ne)
        if t is None:
            raise GGUFError(f"{self.gguf.path}: tensor '{name}' is missing (the architecture needs it)")
        return t

    def optional(self, name: str, ne: tuple | None = None) -> Tensor | None:
        """The tensor or None; `ne` (None entries match any size) is checked when the tensor exists."""
        self.asked.add(name)
        t = self.tensors.get(name)
        if t is not None and ne is not None:
            want = list(ne) + [1] * (4 - len(ne))
            if any(w is not None and w != have for w, have in zip(want, t.ne, strict=False)):
                raise GGUFError(f"{self.gguf.path}: tensor '{name}' has shape {t.ne[:len(ne)]}, expected {list(ne)}")
        return t


    def check_all_asked(self) -> None:
        """Refuse a file holding tensors the architecture never looked up, as llama.cpp refuses one holding
        tensors its architecture does not create ("wrong number of tensors"): a weight the graph would
        leave out (a bias, frequency factors) must not be ignored silently."""
        extra = sorted(set(self.tensors) - self.asked)
        if extra:
            shown = ", ".join(extra[:6]) + (f" and {len(extra) - 6} more" if len(extra) > 6 else "")
            raise GGUFError(f"{self.gguf.path}: {len(extra)} tensor(s) that pyggml's '{self.gguf.architecture}' "
                            f"does not use (llama.cpp refuses such a file too): {shown}")


def load_weights(gguf: GGUFFile, backend, weights: str = "quantized", progress: bool | None = None,
                 elsewhere_prefixes: tuple[str, ...] = ()) -> Weights:
    """Create every tensor of `gguf` and put its data on `backend`'s device (see the module docstring).

    `weights` is "quantized" (the file's block formats, or the interleaved layout of the same bytes) or
    "f32" (quantized tensors expanded to float32 in the device's first extra buffer type).

    Tensors whose names start with one of `elsewhere_prefixes` are created but left unplaced, for the
    caller to place on other backends (`Weights.file_bytes` gives their bytes).
    """
    direct, converted, elsewhere = Context(no_alloc=True), Context(no_alloc=True), Context(no_alloc=True)
    if weights not in WEIGHT_KINDS:
        raise GGMLError(f"weights must be one of {', '.join(WEIGHT_KINDS)}, got {weights!r}")
    extra = backend.device.extra_buffer_types()
    expand_type = next(iter(extra), None) if weights == "f32" else None
    interleave_type = None if weights == "f32" else interleave_buffer_type(backend)
    interleaved = _interleaved(gguf, interleave_type, elsewhere_prefixes) if interleave_type is not None else set()
    infos = {}
    for info in gguf.tensors:
        ne = info.ne[:info.n_dims] or (1,)
        if info.name.startswith(elsewhere_prefixes):
            ctx = elsewhere
        elif expand_type is not None and T.is_quantized(int(info.type)) or info.name in interleaved:
            ctx = converted
        else:
            ctx = direct
        try:
            ctx.new_tensor(T.as_type(int(info.type)), ne, info.name)
        except GGMLError as e:
            raise GGUFError(f"{gguf.path}: tensor '{info.name}' ({info.type.name}{list(info.ne)}): {e}") from e
        infos[info.name] = info
    total = sum(infos[t.name].nbytes for ctx in (direct, converted) for t in ctx)
    with progress_bar(total, progress) as bar:
        if interleave_type is not None and len(converted):
            converted_buffer = _place_interleaved(gguf, interleave_type, converted, infos, bar)
        else:
            converted_buffer = _place_converted(gguf, alloc_ctx_tensors_from_buft(converted, expand_type)
                                                if len(converted) else None, converted, infos, bar)
        buffers = [b for b in (_place_direct(gguf, backend, direct, infos, bar), converted_buffer) if b is not None]
    for b in buffers:
        b.usage = BufferUsage.WEIGHTS
    return Weights(gguf, {t.name: t for ctx in (direct, converted, elsewhere) for t in ctx}, buffers)


def interleave_buffer_type(backend):
    """The extra buffer type of `backend`'s device that interleaves matrices for integer products (one with
    `takes`: the CPU's CPU_INTERLEAVED), or None."""
    return next((b for b in backend.device.extra_buffer_types() if hasattr(b, "takes")), None)


def interleaved_names(buft, matrices, is_layer, untied_embedding: str | None = None) -> set[str]:
    """The all-or-none rule (see the module docstring): of `matrices` ((name, type, ne) of the tensors on one
    backend), the names of those `buft` takes, but `untied_embedding` (an input embedding GET_ROWS alone reads),
    if it takes every quantized one whose name `is_layer`; else none. A tied embedding is the output head as
    well, the largest product of a step: interleaved, its few rows a step are read back out of the groups."""
    matrices = list(matrices)
    takes = {name for name, type_, ne in matrices if buft.takes(type_, ne)}
    layers = [name for name, type_, _ in matrices if is_layer(name) and T.is_quantized(type_)]
    if not layers or not takes.issuperset(layers):
        return set()
    return takes - {untied_embedding}


def _interleaved(gguf: GGUFFile, buft, elsewhere_prefixes: tuple[str, ...]) -> set[str]:
    """The names of the GGUF's matrices that go to `buft` (interleaved_names over its "blk." layers)."""
    here = [(info.name, int(info.type), info.ne[:info.n_dims] or (1,)) for info in gguf.tensors
            if not info.name.startswith(elsewhere_prefixes)]
    tied = all(info.name != OUTPUT for info in gguf.tensors)
    return interleaved_names(buft, here, lambda name: name.startswith("blk."), None if tied else INPUT_EMBEDDING)


def _raw(gguf: GGUFFile, info) -> np.ndarray:
    return np.frombuffer(gguf.tensor_bytes(info), dtype=np.uint8)


def progress_bar(total: int, progress: bool | None):
    """tqdm's bar of the bytes placed: on a terminal only (progress None, as tqdm's disable=None), always (True)
    or never (False). tqdm is imported for a bar that shows only: importing it took 10-20 ms of a warm start."""
    shown = progress if progress is not None else bool(getattr(sys.stderr, "isatty", lambda: False)())
    if not shown:
        return _NoBar()
    from tqdm import tqdm
    return tqdm(total=total, desc="loading", unit="B", unit_scale=True, unit_divisor=1024)


class _NoBar:
    """A bar that is not shown."""

    def __enter__(self) -> _NoBar:
        return self

    def __exit__(self, *exc) -> None:
        return None

    def update(self, n: int = 1) -> None:
        pass


def _place_direct(gguf: GGUFFile, backend, ctx: Context, infos: dict, bar: tqdm):
    """The tensors kept in their file type: wrap the mapping where the device can, else allocate and copy."""
    if not len(ctx):
        return None
    device = backend.device
    if device.props().caps.buffer_from_host_ptr:
        largest = max(infos[t.name].nbytes for t in ctx)
        first = min(infos[t.name].offset_in_file for t in ctx)
        end = max(infos[t.name].offset_in_file + infos[t.name].nbytes for t in ctx)
        buf = device.buffer_from_host_ptr(gguf.buffer[first:end], end - first, largest)
        for t in ctx:
            tensor_alloc(buf, t, buf.base + infos[t.name].offset_in_file - first)
            bar.update(infos[t.name].nbytes)
        return buf
    buf = alloc_ctx_tensors_from_buft(ctx, backend.default_buffer_type)
    for t in ctx:
        tensor_set(t, _raw(gguf, infos[t.name]))
        bar.update(t.nbytes)
    return buf


def _place_interleaved(gguf: GGUFFile, buft, ctx: Context, infos: dict, bar: tqdm):
    """The matrices of the interleaved buffer type, one after another: mapped from the layout cache where it holds
    this file's (pyggml.models.gguf.layout_cache), else repacked, and then written there in the background."""
    placed, size = [], 0
    for t in ctx:
        offset = -(-size // buft.alignment) * buft.alignment
        placed.append(layout_cache.Placed(t.name, int(t.type), tuple(t.ne), offset, buft.alloc_size(t)))
        size = offset + placed[-1].nbytes
    directory = layout_cache.cache_dir() if size >= layout_cache.MIN_BYTES and os.path.isfile(gguf.path) else None
    entry = layout_cache.Entry(gguf.path, placed, size, buft.layout_version) if directory is not None else None

    def first_and_last_groups(p: layout_cache.Placed) -> list[tuple[int, np.ndarray]]:
        row, raw = T.row_size(p.type, p.ne[0]), _raw(gguf, infos[p.name])
        group = buft.group_rows * row
        return [(start, buft.converted(p.type, raw[start:start + group].reshape(-1, row)))
                for start in sorted({0, p.nbytes - group})]

    cached = entry.open(directory, first_and_last_groups) if entry is not None else None
    incoming = layout_cache.Incoming.create(entry, directory) if entry is not None and cached is None else None
    memory = cached if cached is not None else incoming.array if incoming is not None else None
    buf = buft.buffer_over(memory) if memory is not None else buft.alloc_buffer(size)
    for t, p in zip(ctx, placed, strict=True):
        tensor_alloc(buf, t, buf.base + p.offset)
    if cached is not None:
        bar.update(size)
        return buf
    try:
        _place_converted(gguf, buf, ctx, infos, bar)
    except BaseException:
        if incoming is not None:
            incoming.abandon()
        raise
    if incoming is not None:
        incoming.commit()
        buf.read_only = True  # the entry's file: written once, by the repack
    return buf


def _place_converted(gguf: GGUFFile, buf, ctx: Context, infos: dict, bar: tqdm):
    """Quantized tensors written into their buffer of a converting type (CPU_F32, CPU_INTERLEAVED) a slab of rows
    at a time (so a 262144-row embedding is never converted in one piece), each slab's file pages released once
    converted."""
    if buf is None:
        return None
    for t in ctx:
        info, raw = infos[t.name], _raw(gguf, infos[t.name])
        slab = CONVERT_ROWS * T.row_size(t.type, t.ne[0])
        for start in range(0, raw.size, slab):
            chunk = raw[start:start + slab]
            try:
                tensor_set(t, chunk, start, chunk.size)
            except GGMLError as e:
                raise GGUFError(f"{gguf.path}: tensor '{t.name}' of type {T.type_name(t.type)} cannot be placed in "
                                f"{buf.buft.name}: {e}") from e
            gguf.release_pages(info.offset_in_file + start, chunk.size)
            bar.update(chunk.size)
    return buf
