"""Writes ggml's CPU GELU and GELU_QUICK over every F16 input (ggml_table_gelu_f16 and ggml_table_gelu_quick_f16,
as its ops read them for -10 < x < 10) to ggml_gelu_tables.npz, computed by the ggml of llama-cpp-python (run it
with a Python that has llama_cpp). ggml fills the tables with the C library's tanhf and expf, so the C library's
name and version are kept with them:

    python -m tests.backend.cpu.data.make_ggml_gelu_tables
"""

from __future__ import annotations

import ctypes as C
import importlib.util
import platform
from pathlib import Path

import numpy as np

from tests.support.ggml_peer import declare

OUT = Path(__file__).parent / "ggml_gelu_tables.npz"
GGML_TYPE_F32 = 0


class InitParams(C.Structure):
    _fields_ = [("mem_size", C.c_size_t), ("mem_buffer", C.c_void_p), ("no_alloc", C.c_bool)]


def ggml_library():
    """The ggml functions used here, from llama_cpp's lib folder (found without importing llama_cpp)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None:
        raise SystemExit("needs llama-cpp-python (the llamacpp extra)")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    handles = [C.CDLL(str(lib / name), mode=C.RTLD_GLOBAL) for name in ("libggml-base.so", "libggml-cpu.so")]
    p = C.c_void_p
    signatures = {"ggml_init": (p, [InitParams]), "ggml_new_tensor_1d": (p, [p, C.c_int, C.c_int64]),
                  "ggml_gelu": (p, [p, p]), "ggml_gelu_quick": (p, [p, p]), "ggml_get_data_f32": (p, [p]),
                  "ggml_new_graph": (p, [p]), "ggml_build_forward_expand": (None, [p, p]),
                  "ggml_graph_compute_with_ctx": (C.c_int, [p, p, C.c_int]), "ggml_free": (None, [p])}
    return declare(handles, signatures)


def main() -> None:
    g = ggml_library()
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    ctx = g["ggml_init"](InitParams(64 << 20, None, False))
    inp = g["ggml_new_tensor_1d"](ctx, GGML_TYPE_F32, x.size)
    C.memmove(g["ggml_get_data_f32"](inp), x.ctypes.data, x.nbytes)
    outs = {"gelu": g["ggml_gelu"](ctx, inp), "gelu_quick": g["ggml_gelu_quick"](ctx, inp)}
    graph = g["ggml_new_graph"](ctx)
    for out in outs.values():
        g["ggml_build_forward_expand"](graph, out)
    if g["ggml_graph_compute_with_ctx"](ctx, graph, 1) != 0:
        raise SystemExit("ggml's compute failed")
    tables = {}
    for name, out in outs.items():
        values = np.ctypeslib.as_array(C.cast(g["ggml_get_data_f32"](out), C.POINTER(C.c_float)), (x.size,))
        tables[name] = values.astype(np.float16).view(np.uint16)  # table entries are F16: exact
    g["ggml_free"](ctx)
    np.savez_compressed(OUT, libc=np.array(" ".join(platform.libc_ver())), **tables)
    print(OUT, {k: v.shape for k, v in tables.items()})


if __name__ == "__main__":
    main()
