"""The NumPy CPU backend (buffer types, device, reg, backend); its kernels are in `cpu.kernels`."""

from pyggml.backend.cpu.backend import (CPU_GUID, CPU_REG, CpuBackend, CpuDevice, CpuGraphPlan, CpuReg, get_features,
                                        init, is_cpu, set_abort_callback, set_n_threads)
from pyggml.backend.cpu.buffer import CpuBuffer, CpuBufferType, CpuMappedBufferType

__all__ = ["CPU_GUID", "CPU_REG", "CpuBackend", "CpuBuffer", "CpuBufferType", "CpuDevice", "CpuGraphPlan",
           "CpuMappedBufferType", "CpuReg", "get_features", "init", "is_cpu", "set_abort_callback", "set_n_threads"]
