"""Tensors, contexts, graphs and op builders: everything that describes computation, nothing that runs it."""

from pyggml.core.context import Context
from pyggml.core.graph import DEFAULT_GRAPH_SIZE, EvalOrder, Graph
from pyggml.core.graph_json import LoadedGraph, load_graph_json, save_graph_json
from pyggml.core.tensor import GluOp, Op, Tensor, TensorFlag, UnaryOp
from pyggml.core.types import GGMLType

__all__ = ["Context", "DEFAULT_GRAPH_SIZE", "EvalOrder", "GGMLType", "Graph", "GluOp", "LoadedGraph", "Op",
           "Tensor", "TensorFlag", "UnaryOp", "load_graph_json", "save_graph_json"]
