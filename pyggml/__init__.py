"""pyggml: ggml's tensor runtime in Python."""

from pyggml import errors
from pyggml.core import ops
from pyggml.core import (Context, EvalOrder, GGMLType, Graph, GluOp, LoadedGraph, Op, Tensor, TensorFlag, UnaryOp,
                         load_graph_json, save_graph_json)
from pyggml import backend  # noqa: E402 - after core: the backend layer builds on it
from pyggml.backend import BufferUsage, DeviceType, Status  # noqa: E402
from pyggml import alloc  # noqa: E402 - after core: alloc builds on it (and brings pyggml.backend)
from pyggml import sched  # noqa: E402
from pyggml import models  # noqa: E402

__version__ = "0.1.0"
__all__ = ["alloc", "backend", "models", "ops", "sched", "BufferUsage", "DeviceType", "Status", "Context", "EvalOrder", "GGMLType", "Graph",
           "GluOp", "LoadedGraph", "Op", "Tensor", "TensorFlag", "UnaryOp", "errors", "load_graph_json",
           "save_graph_json"]
