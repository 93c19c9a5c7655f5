"""Numba's runtime around the compiled kernels: the on-disk cache (compile_cache) and LLVM's code pages
handed back to the OS after kernels load (compiler_pages). No kernels here."""
