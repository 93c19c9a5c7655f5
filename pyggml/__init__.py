"""pyggml: ggml's tensor runtime in Python."""

import gc
import os
import sys

# OpenBLAS's idle workers spin for 2^28 cycles (~0.1 s) after a call before they sleep; on a machine with
# few cores they then take the cores from the compiled kernels' threads: the first tokens after a prompt
# (BLAS products) took 25-57 ms instead of 13 for Gemma 3 270M on 2 cores. 2^22 cycles (~1-2 ms) still
# bridges the gaps between a prompt's products. Read when NumPy loads OpenBLAS: it has effect only if
# NumPy was not imported before pyggml, and an OPENBLAS_THREAD_TIMEOUT set by the user is kept.
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "22")

# Numba imports PyYAML, where it is installed, only to read a `.numba_config.yaml` from the working directory (5-10
# ms of every start). Where there is no such file and neither is imported yet, PyYAML is hidden while Numba
# imports, then shown again: Numba reads the same configuration, and `import yaml` works as before afterwards.
_hide_yaml = not ({"numba", "yaml"} & sys.modules.keys()) and not os.path.isfile(".numba_config.yaml")
if _hide_yaml:
    sys.modules["yaml"] = None  # an import of it fails with ImportError, as if it were not installed

# The cyclic garbage collector is held off while the package and its dependencies (NumPy, Numba, LLVM's bindings)
# import, and what they made is then moved out of its sight (gc.freeze): it lives as long as the process (modules,
# their functions and tables), yet every collection walked it. The imports' hundreds of thousands of objects set
# off about 160 collections, three of them full, and the later collections of a model's load and steps walked
# them again: 0.1-0.2 s of CPU in a 32-token `pyggml generate`. The collector's on/off state is restored after.
_collecting = gc.isenabled()
gc.disable()
try:
    from pyggml import errors  # after the environment above
    from pyggml.core import ops
    from pyggml.core import (Context, EvalOrder, GGMLType, Graph, GluOp, LoadedGraph, Op, Tensor, TensorFlag, UnaryOp,
                             load_graph_json, save_graph_json)
    from pyggml import backend  # after core: the backend layer builds on it
    from pyggml.backend import BufferUsage, DeviceType, Status
    from pyggml import alloc  # after core: alloc builds on it (and brings pyggml.backend)
    from pyggml import sched
    from pyggml import models
finally:
    gc.freeze()
    if _collecting:
        gc.enable()
    if _hide_yaml and sys.modules.get("yaml", 0) is None:
        del sys.modules["yaml"]
    del _collecting, _hide_yaml

__version__ = "0.1.0"
__all__ = ["alloc", "backend", "models", "ops", "sched", "BufferUsage", "DeviceType", "Status", "Context", "EvalOrder",
           "GGMLType", "Graph", "GluOp", "LoadedGraph", "Op", "Tensor", "TensorFlag", "UnaryOp", "errors",
           "load_graph_json", "load_model", "load_whisper", "save_graph_json"]


def __getattr__(name: str):
    """`pyggml.load_model` and `pyggml.load_whisper`, imported when first asked for (Whisper's modules are not
    loaded by `import pyggml`)."""
    if name == "load_model":
        from pyggml.models import load_model
        return load_model
    if name == "load_whisper":
        from pyggml.models.whisper.transcribe import load_whisper
        return load_whisper
    raise AttributeError(f"module 'pyggml' has no attribute {name!r}")
