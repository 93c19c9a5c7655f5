"""The PyTorch backend: devices "TORCH_CPU" and "CUDA0".. under the registry entry "TORCH".

Importing this package registers the "TORCH" reg (when torch is installed). It is also the
`pyggml.backends` entry point `torch = "pyggml.backend.torch:init"`, so `registry.load_all()`
finds it; `score()` is 0 without torch, and load_all then skips it silently.
"""

from importlib.util import find_spec

from pyggml.backend.registry import register_backend
from pyggml.errors import BackendError


def score() -> int:
    """ggml_backend_score: 0 (cannot run here) when torch is not installed."""
    return int(find_spec("torch") is not None)


if score():
    from pyggml.backend.torch.backend import (TORCH_GUID, TORCH_REG, TorchBackend, TorchBuffer, TorchBufferType,
                                              TorchDevice, TorchEvent, TorchReg, get_features, to_torch)

    register_backend(TORCH_REG)


def init():
    """The TORCH reg (the Python form of ggml_backend_init)."""
    if not score():
        raise BackendError("the torch backend needs PyTorch: pip install 'pyggml[torch]'")
    return TORCH_REG


def is_torch(backend) -> bool:
    return backend is not None and backend.guid == TORCH_GUID


__all__ = ["TORCH_GUID", "TORCH_REG", "TorchBackend", "TorchBuffer", "TorchBufferType", "TorchDevice", "TorchEvent",
           "TorchReg", "get_features", "init", "is_torch", "score", "to_torch"]
