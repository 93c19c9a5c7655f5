"""The backend layer: buffer types, buffers, backends, events, devices, the registry, and the NumPy CPU backend.

Importing it registers the CPU backend, so `init_by_name("CPU")` and `init_best()` always work.
"""

from pyggml.backend import cpu
from pyggml.backend.base import (Backend, BackendReg, Buffer, BufferType, BufferUsage, Device, DeviceCaps,
                                 DeviceProps, DeviceType, Event, Status)
from pyggml.backend.cpu import is_cpu
from pyggml.backend.extensions import load_kernels, proc_address, set_n_threads
from pyggml.backend.graph_copy import GraphCopy, compare_graph_backend, graph_copy
from pyggml.backend.multi_buffer import MultiBuffer, is_multi_buffer, multi_buffer
from pyggml.backend.registry import (backend_by_name, backends, device_by_name, device_by_type, devices, init_best,
                                     init_by_name, init_by_type, load_all, load_backend, reg_by_name,
                                     register_backend, register_device, unregister_backend)
from pyggml.backend.tensor_io import (host_bytes, tensor_alloc, tensor_buffer, tensor_copy, tensor_copy_async,
                                      tensor_get, tensor_get_2d, tensor_get_async, tensor_memset, tensor_set,
                                      tensor_set_2d, tensor_set_async, view_init)

register_backend(cpu.CPU_REG)

__all__ = ["Backend", "BackendReg", "Buffer", "BufferType", "BufferUsage", "Device", "DeviceCaps", "DeviceProps",
           "DeviceType", "Event", "GraphCopy", "MultiBuffer", "Status", "backend_by_name", "backends",
           "compare_graph_backend", "cpu", "device_by_name", "device_by_type", "devices", "graph_copy", "host_bytes",
           "init_best", "init_by_name", "init_by_type", "is_cpu", "is_multi_buffer", "load_all", "load_backend",
           "load_kernels", "multi_buffer", "proc_address", "reg_by_name", "register_backend", "register_device",
           "set_n_threads", "tensor_alloc", "tensor_buffer", "tensor_copy", "tensor_copy_async", "tensor_get",
           "tensor_get_2d", "tensor_get_async", "tensor_memset", "tensor_set", "tensor_set_2d", "tensor_set_async",
           "unregister_backend", "view_init"]
