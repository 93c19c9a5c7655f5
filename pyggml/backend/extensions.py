"""A backend's extension functions reached through its registry entry (ggml's get_proc_address), so that the
layers above need no backend's module: each is a no-op on a backend that does not offer it."""

from __future__ import annotations

from typing import Iterable

from pyggml.backend.base import Backend


def proc_address(backend: Backend, name: str):
    """The extension function `name` of the backend's registry entry, or None."""
    reg = getattr(backend.device, "reg", None)
    return reg.get_proc_address(name) if reg is not None else None


def set_n_threads(backend: Backend, n_threads: int) -> bool:
    """ggml_backend_set_n_threads: the threads of the backend's computes, where it takes a count (the CPU's);
    returns whether it did."""
    fn = proc_address(backend, "set_n_threads")
    if fn is None:
        return False
    fn(backend, n_threads)
    return True


def load_kernels(backend: Backend, types: Iterable | None = None) -> int:
    """Have the backend load now the compiled kernels its computes over tensors of these ggml types call (None:
    of every type; the CPU's come from their disk cache), rather than at a first compute; returns how many it
    loaded."""
    fn = proc_address(backend, "load_kernels")
    if fn is None:
        return 0
    return fn(backend, None if types is None else [int(t) for t in types])
