"""Memory planning: the linear tensor allocator, the graph allocator and its planners, whole-context allocation."""

from pyggml.alloc import planner
from pyggml.alloc.ctx_alloc import alloc_ctx_tensors, alloc_ctx_tensors_from_buft, alloc_ctx_tensors_from_buft_size
from pyggml.alloc.gallocr import GraphAllocator
from pyggml.alloc.plan import Plan, compute_poisoned
from pyggml.alloc.tallocr import TensorAllocator

__all__ = ["GraphAllocator", "Plan", "TensorAllocator", "alloc_ctx_tensors", "alloc_ctx_tensors_from_buft",
           "alloc_ctx_tensors_from_buft_size", "compute_poisoned", "planner"]
