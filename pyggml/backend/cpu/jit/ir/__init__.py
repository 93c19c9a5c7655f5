"""LLVM vector IR for the compiled kernels (llvmlite's IR builder inside Numba intrinsics, no C): the row dots of
the 32-value block types (block_ir) and the integer tile products of the interleaved layouts (vnni_ir)."""
