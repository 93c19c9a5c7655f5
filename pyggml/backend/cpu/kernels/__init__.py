"""CPU kernels, registered per op. A kernel reads its sources and writes into the destination view in place.

`supports(t)` is the truth about what the CPU backend can compute; `compute(t)` runs one node.
A kernel may also have a `bind(t)`: for the cases it handles it returns a call with no arguments that
computes t from views and parameters looked up once (mostly a compiled kernel of `cpu.jit`), so that a
graph computed again (a model's next token) costs one call per node; `bound(t, k)` picks it or `fn(t)`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyggml.backend.cpu.kernels._common import INTERLEAVED
from pyggml.core.tensor import Op, Tensor, VIEW_OPS
from pyggml.errors import UnsupportedOpError


@dataclass(frozen=True)
class Kernel:
    fn: Callable[[Tensor], None]
    supports: Callable[[Tensor], bool]
    bind: Callable[[Tensor], Callable[[], None] | None] | None = None


KERNELS: dict[Op, Kernel] = {}


def _always(_t: Tensor) -> bool:
    return True


def _no_interleaved_source(supports: Callable[[Tensor], bool], t: Tensor) -> bool:
    return all(s.extra is not INTERLEAVED for s in t.srcs) and supports(t)


def kernel(*ops: Op, supports: Callable[[Tensor], bool] = _always,
           bind: Callable[[Tensor], Callable[[], None] | None] | None = None, reads_interleaved: bool = False):
    """Register fn as the kernel of ops; `supports(dst)` says which type/shape combinations it handles,
    `bind(dst)` gives the pre-bound call for the cases it covers (None for the others, which run fn).
    Only a kernel that `reads_interleaved` is given a source in a CPU_INTERLEAVED buffer (not host bytes)."""
    if not reads_interleaved:
        supports = functools.partial(_no_interleaved_source, supports)

    def register(fn):
        for op in ops:
            if op in KERNELS:
                raise RuntimeError(f"two CPU kernels registered for {op.name}")
            KERNELS[op] = Kernel(fn, supports, bind)
        return fn

    return register


def supports(t: Tensor) -> bool:
    if t.op == Op.NONE or t.op in VIEW_OPS:
        return True
    k = KERNELS.get(t.op)
    return k is not None and k.supports(t)


def bound(t: Tensor, k: Kernel) -> Callable[[], None]:
    """The call that computes node t with kernel k: k's pre-bound call where it has one for t, else k.fn(t).

    The pre-bound call holds views of t's and its sources' memory, so it is valid while they stay where
    they are (the CPU backend's graph plans re-bind when an address changes); tensors without memory yet
    get k.fn, which reports them when run.
    """
    if k.bind is not None and all(s.data is not None for s in (t, *t.srcs)):
        call = k.bind(t)
        if call is not None:
            return call
    return functools.partial(k.fn, t)


def compute(t: Tensor) -> None:
    """Compute one node; views and NONE do nothing (their memory is their source's). On its own, not in a
    graph: no quantized activations are reused from an earlier call."""
    mul_mat.forget_quantized_activations()
    if t.op == Op.NONE or t.op in VIEW_OPS or t.is_empty:
        return
    k = KERNELS.get(t.op)
    if k is None or not k.supports(t):
        srcs = ", ".join(f"{s.type.name}{list(s.ne)}" for s in t.srcs)
        raise UnsupportedOpError(f"CPU backend has no kernel for {t.op.name} -> {t.type.name} from ({srcs}) "
                                 f"in node {t.name!r}")
    with np.errstate(all="ignore"):  # C float semantics: inf and NaN without NumPy warnings
        bound(t, k)()


# Kernel modules register themselves on import.
from pyggml.backend.cpu.kernels import (  # noqa: E402,F401
    attention, conv, elementwise, layout, mul_mat, norm, recurrent, reduce, unary,
)
