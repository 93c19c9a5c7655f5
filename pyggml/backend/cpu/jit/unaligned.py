"""2- and 4-byte words read from and written to any byte of a uint8 array, for compiled kernels that move a
quantized block's fields (jit/repack.py): one unaligned load or store where four byte moves with NumPy's
signed-index checks kept the repack at 0.5 GB/s a thread (about 10 GB/s as words)."""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic


def _byte_pointer(context, builder, array_type, array, index, width: int):
    """The address of byte `index` of a uint8 array as a pointer to a `width`-byte integer."""
    data = context.make_array(array_type)(context, builder, array).data
    return builder.bitcast(builder.gep(data, [index]), ir.IntType(8 * width).as_pointer())


def _low_bits(builder, value, value_type, width: int):
    """The low `width` bytes of an integer (Numba widens uint32 arithmetic to 64 bits)."""
    if value_type.bitwidth > 8 * width:
        return builder.trunc(value, ir.IntType(8 * width))
    if value_type.bitwidth < 8 * width:
        return builder.zext(value, ir.IntType(8 * width))
    return value


def _word_access(width: int):
    word = types.Integer.from_bitwidth(8 * width, signed=False)

    @intrinsic
    def load(typingctx, array, index):
        if not (isinstance(array, types.Array) and array.dtype == types.uint8 and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            return builder.load(_byte_pointer(context, builder, signature.args[0], args[0], args[1], width), align=1)

        return word(array, index), codegen

    @intrinsic
    def store(typingctx, array, index, value):
        if not (isinstance(array, types.Array) and array.dtype == types.uint8 and isinstance(index, types.Integer)
                and isinstance(value, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            pointer = _byte_pointer(context, builder, signature.args[0], args[0], args[1], width)
            builder.store(_low_bits(builder, args[2], signature.args[2], width), pointer, align=1)
            return context.get_dummy_value()

        return types.void(array, index, value), codegen

    return load, store


load_u16, store_u16 = _word_access(2)
"""load_u16(a, i): the uint16 in bytes i, i+1 of uint8 array a (little-endian, as the machine); store_u16(a, i, v)
writes the low 16 bits of integer v there. No bounds check: the caller keeps i + 2 <= a.size."""
load_u32, store_u32 = _word_access(4)
"""load_u32 / store_u32: load_u16 / store_u16 for a uint32 in bytes i .. i+3."""
