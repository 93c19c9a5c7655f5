"""The process-wide backend registry (ggml-backend-reg.cpp) and loading of third-party backends.

A third-party package declares, in its pyproject.toml,

    [project.entry-points."pyggml.backends"]
    mybackend = "mypackage.backend:init"

where `init()` returns a BackendReg (the Python form of ggml_backend_init); an optional
`score()` in the same module that returns 0 rejects the backend on this system, as
ggml_backend_score does. `load_all()` loads every installed entry point (each once).

A name that no registered device has makes `device_by_name`, `reg_by_name`, `init_by_name` and
`init_by_type` call `load_all()` once and look again, and `init_best` loads them before it chooses
(llama.cpp's tools call ggml_backend_load_all at start-up for the same reason): an installed plugin
is found by name without an explicit `load_all()`.
Lookups that still find nothing return None (as ggml returns NULL); the init_* functions raise
BackendError instead, naming every registered device.

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
_load_lock = threading.RLock()  # serializes load_all; held while plugins import, so never taken under _lock
_loaded: dict[tuple[str, str], BackendReg | None] = {}  # entry point (name, value) -> its reg (None: refused)
_entry_points_loaded = False  # load_all has run since the last unregister


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
    global _entry_points_loaded
    with _lock:
        _devices[:] = [d for d in _devices if d.reg is not reg]
        _regs[:] = [r for r in _regs if r is not reg]
        for key in [k for k, r in _loaded.items() if r is reg]:
            del _loaded[key]  # a later load_all loads that entry point again, as after ggml_backend_unload
            _entry_points_loaded = False


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


def _find(lookup):
    """lookup(), and again after loading the installed plugins once when it found nothing."""
    found = lookup()
    if found is None and not _entry_points_loaded:
        load_all()
        found = lookup()
    return found


def reg_by_name(name: str) -> BackendReg | None:
    """The reg called `name` (case-insensitive), or None."""
    return _find(lambda: next((r for r in backends() if r.name.lower() == name.lower()), None))


backend_by_name = reg_by_name


def device_by_name(name: str) -> Device | None:
    """The device called `name` (case-insensitive), or None."""
    return _find(lambda: next((d for d in devices() if d.name.lower() == name.lower()), None))


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
    dev = _find(lambda: device_by_type(DeviceType(type_)))
    if dev is None:
        raise BackendError(f"no device of type {DeviceType(type_).name}; registered devices: {_known()}")
    return dev.init_backend(params)


def init_best() -> Backend:
    """A backend on the first GPU, else the first integrated GPU, else the first CPU (plugins loaded first)."""
    if not _entry_points_loaded:
        load_all()
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
    """Load every installed `pyggml.backends` entry point not loaded yet and return the regs of all the
    installed ones. Idempotent: an entry point is loaded once (again only after its reg is unregistered);
    one that fails is skipped with a warning, once."""
    global _entry_points_loaded
    with _load_lock:
        keys = []
        for ep in entry_points(group=ENTRY_POINT_GROUP):
            key = (ep.name, ep.value)
            keys.append(key)
            if key in _loaded:
                continue
            with _lock:
                _loaded[key] = None  # being loaded: an init() that looks up an unknown name must not load it again
            try:
                reg = load_backend(ep)
            except BackendError as e:
                warnings.warn(str(e), RuntimeWarning, stacklevel=2)
                reg = None
            with _lock:
                _loaded[key] = reg
        _entry_points_loaded = True
        return list(dict.fromkeys(r for r in (_loaded.get(k) for k in keys) if r is not None))
