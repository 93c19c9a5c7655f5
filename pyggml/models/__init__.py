"""GGUF models end to end: reader, tokenizer, weights loader, architectures, KV cache, sampling and the Model API."""

from pyggml.models.llm.model import Model, Timings, default_model_path, load_model

__all__ = ["Model", "Timings", "default_model_path", "load_model"]
