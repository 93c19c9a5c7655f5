"""A software prefetch for compiled kernels whose reads the hardware prefetchers do not foresee.

The KV cache's products read short rows far apart (a head's 128 F16 values in every 2 KiB row of an 8B model's K
cache): the hardware streams find no run to follow, so each row came from memory at its full latency (one
layer's K product 171 us from memory against 54 us from cache). Asking for a row several rows ahead while this
one is multiplied overlaps those waits. The interleaved weights' tiles ask for their stream ahead when a token is
alone (ir/vnni_ir.py's PREFETCH_AHEAD: 4 KiB on an Intel Xeon's AVX-512, 16 KiB on an AMD EPYC's AVX2).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_I32 = ir.IntType(32)


def prefetch_pointer(builder, pointer) -> None:
    """Ask for the cache line holding the byte `pointer` points at, into every cache level (a read of data)."""
    line = builder.bitcast(pointer, ir.IntType(8).as_pointer())
    fn = builder.module.declare_intrinsic("llvm.prefetch.p0i8", fnty=ir.FunctionType(
        ir.VoidType(), [line.type, _I32, _I32, _I32]))
    builder.call(fn, [line, ir.Constant(_I32, 0), ir.Constant(_I32, 3), ir.Constant(_I32, 1)])


@intrinsic
def prefetch(typingctx, array, index):
    """Ask for the cache line holding array[index] (no bounds check: a prefetch never faults, so an index past
    the end costs nothing but the request)."""
    if not isinstance(array, types.Array) or not isinstance(index, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        prefetch_pointer(builder, builder.gep(data, [args[1]]))
        return context.get_dummy_value()

    return types.none(array, index), codegen
