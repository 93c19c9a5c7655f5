"""The process-wide backend registry (ggml-backend-reg.cpp) and loading of third-party backends.

A third-party package declares, in its pyproject.toml,

    [project.entry-points."pyggml.backends"]
    mybackend = "mypackage.backend:init"

where `init()` returns a BackendReg (the Python form of ggml_backend_init); an optional
`score()` in the same module that returns 0 rejects the backend on this system, as
ggml_backend_score does. `load_all()` loads every installed entry point.

Lookups that find nothing return None (as ggml returns NULL); the init_* functions raise
BackendError instead, naming what is registered.

Thread-safety: every function may be called from any thread; registration is serialized.
"""

from __future__ import annotations

import importlib
import sys
import threading
import warnings
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType

from pyggml.backend.base import API_VERSION, Backend, BackendReg, Device, DeviceType
from pyggml.errors import BackendError

ENTRY_POINT_GROUP = "pyggml.backends"

_lock = threading.RLock()
_regs: list[BackendReg] = []
_devices: list[Device] = []


# ----------------------------------------------------------------------------------------------
# Registration
# ----------------------------------------------------------------------------------------------
def register_backend(reg: BackendReg | None) -> None:
    """Add a reg and its devices; None and a reg already registered are ignored."""
    if reg is None:
        return
    with _lock:
        if any(r is reg for r in _regs):
            return
        _regs.append(reg)
        for i in range(reg.device_count):
            register_device(reg.device(i))


def register_device(dev: Device) -> None:
    """Add one device (e.g. a device that belongs to no reg); duplicates are ignored."""
    with _lock:
        if not any(d is dev for d in _devices):
            _devices.append(dev)


def unregister_backend(reg: BackendReg) -> None:
    """Remove a reg and its devices (ggml_backend_unload)."""
    with _lock:
        _devices[:] = [d for d in _devices if d.reg is not reg]
        _regs[:] = [r for r in _regs if r is not reg]


# ----------------------------------------------------------------------------------------------
# Lookup
# ----------------------------------------------------------------------------------------------
def backends() -> list[BackendReg]:
    """The registered regs, in registration order."""
    with _lock:
        return list(_regs)


def devices() -> list[Device]:
    """The registered devices, in registration order."""
    with _lock:
        return list(_devices)


def reg_by_name(name: str) -> BackendReg | None:
    """The reg called `name` (case-insensitive), or None."""
    return next((r for r in backends() if r.name.lower() == name.lower()), None)


backend_by_name = reg_by_name


def device_by_name(name: str) -> Device | None:
    """The device called `name` (case-insensitive), or None."""
    return next((d for d in devices() if d.name.lower() == name.lower()), None)


def device_by_type(type_: DeviceType) -> Device | None:
    """The first registered device of that type, or None."""
    return next((d for d in devices() if d.type == type_), None)


# ----------------------------------------------------------------------------------------------
# Initialisation
# ----------------------------------------------------------------------------------------------
def _known() -> str:
    return ", ".join(f"{d.name} ({DeviceType(d.type).name})" for d in devices()) or "none"


def init_by_name(name: str, params: str | None = None) -> Backend:
    dev = device_by_name(name)
    if dev is None:
        raise BackendError(f"no device named {name!r}; registered devices: {_known()}")
    return dev.init_backend(params)


def init_by_type(type_: DeviceType, params: str | None = None) -> Backend:
    dev = device_by_type(DeviceType(type_))
    if dev is None:
        raise BackendError(f"no device of type {DeviceType(type_).name}; registered devices: {_known()}")
    return dev.init_backend(params)


def init_best() -> Backend:
    """A backend on the first GPU, else the first integrated GPU, else the first CPU."""
    for type_ in (DeviceType.GPU, DeviceType.IGPU, DeviceType.CPU):
        dev = device_by_type(type_)
        if dev is not None:
            return dev.init_backend(None)
    raise BackendError(f"no GPU, IGPU or CPU device is registered; registered devices: {_known()}")


# ----------------------------------------------------------------------------------------------
# Loading third-party backends
# ----------------------------------------------------------------------------------------------
def _resolve(source: EntryPoint | str | ModuleType):
    """(init function, its module) for an entry point, "module:attr", "module" or a module object."""
    if isinstance(source, EntryPoint):
        init = source.load()
        return init, sys.modules.get(getattr(init, "__module__", ""), None)
    if isinstance(source, str):
        module_name, _, attr = source.partition(":")
        module = importlib.import_module(module_name)
        return getattr(module, attr or "init"), module
    return source.init, source


def load_backend(source: EntryPoint | str | ModuleType) -> BackendReg | None:
    """Load and register a backend (ggml_backend_load); None when its score() says it cannot run here."""
    label = getattr(source, "value", None) or getattr(source, "__name__", None) or str(source)
    try:
        init, module = _resolve(source)
    except (ImportError, AttributeError) as e:
        raise BackendError(f"load_backend: cannot load {label!r}: {e}") from e
    score = getattr(module, "score", None)
    if score is not None and score() == 0:
        return None
    try:
        reg = init()
    except Exception as e:
        raise BackendError(f"load_backend: {label!r} failed to initialise: {e}") from e
    if not isinstance(reg, BackendReg):
        raise BackendError(f"load_backend: {label!r} returned {reg!r}, not a BackendReg")
    if reg.api_version != API_VERSION:
        raise BackendError(f"load_backend: {label!r} has API version {reg.api_version}, expected {API_VERSION}")
    register_backend(reg)
    return reg


def load_all() -> list[BackendReg]:
    """Load every installed `pyggml.backends` entry point; one that fails is skipped with a warning."""
    loaded = []
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            reg = load_backend(ep)
        except BackendError as e:
            warnings.warn(str(e), RuntimeWarning, stacklevel=2)
            continue
        if reg is not None:
            loaded.append(reg)
    return loaded
