"""CPU kernels, registered per op. A kernel reads its sources and writes into the destination view in place.

`supports(t)` is the truth about what the CPU backend can compute; `compute(t)` runs one node.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from pyggml.core.tensor import Op, Tensor, VIEW_OPS
from pyggml.errors import UnsupportedOpError


@dataclass(frozen=True)
class Kernel:
    fn: Callable[[Tensor], None]
    supports: Callable[[Tensor], bool]


KERNELS: dict[Op, Kernel] = {}


def _always(_t: Tensor) -> bool:
    return True


def kernel(*ops: Op, supports: Callable[[Tensor], bool] = _always):
    """Register fn as the kernel of ops; `supports(dst)` says which type/shape combinations it handles."""

    def register(fn):
        for op in ops:
            if op in KERNELS:
                raise RuntimeError(f"two CPU kernels registered for {op.name}")
            KERNELS[op] = Kernel(fn, supports)
        return fn

    return register


def supports(t: Tensor) -> bool:
    if t.op == Op.NONE or t.op in VIEW_OPS:
        return True
    k = KERNELS.get(t.op)
    return k is not None and k.supports(t)


def compute(t: Tensor) -> None:
    """Compute one node; views and NONE do nothing (their memory is their source's)."""
    if t.op == Op.NONE or t.op in VIEW_OPS or t.is_empty:
        return
    k = KERNELS.get(t.op)
    if k is None or not k.supports(t):
        srcs = ", ".join(f"{s.type.name}{list(s.ne)}" for s in t.srcs)
        raise UnsupportedOpError(f"CPU backend has no kernel for {t.op.name} -> {t.type.name} from ({srcs}) "
                                 f"in node {t.name!r}")
    k.fn(t)


# Kernel modules register themselves on import.
from pyggml.backend.cpu.kernels import (  # noqa: E402,F401
    attention, conv, elementwise, layout, matmul, norm, reduce, unary,
)
