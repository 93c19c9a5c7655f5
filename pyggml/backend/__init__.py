"""The backend layer: buffer types, buffers, backends, events, devices, the registry, and the NumPy CPU backend."""

from pyggml.backend.base import (Backend, BackendReg, Buffer, BufferType, BufferUsage, Device, DeviceCaps,
                                 DeviceProps, DeviceType, Event, Status)
from pyggml.backend.tensor_io import (tensor_alloc, tensor_buffer, tensor_copy, tensor_copy_async, tensor_get,
                                      tensor_get_2d, tensor_get_async, tensor_memset, tensor_set, tensor_set_2d,
                                      tensor_set_async, view_init)

__all__ = ["Backend", "BackendReg", "Buffer", "BufferType", "BufferUsage", "Device", "DeviceCaps", "DeviceProps",
           "DeviceType", "Event", "Status", "tensor_alloc", "tensor_buffer", "tensor_copy", "tensor_copy_async",
           "tensor_get", "tensor_get_2d", "tensor_get_async", "tensor_memset", "tensor_set", "tensor_set_2d",
           "tensor_set_async", "view_init"]
