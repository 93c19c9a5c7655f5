"""The process-wide registry: lookups, duplicates, init order, and loading backends from entry points.

Entry points are tested with real (tiny) distributions written into tmp_path and put on sys.path.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tests.support.minimal_backend import MinimalDevice, MinimalReg

from pyggml.backend import cpu, registry
from pyggml.backend.base import DeviceType
from pyggml.errors import BackendError

FAKE_MODULE = '''
from tests.support.minimal_backend import MinimalBackend, MinimalDevice, MinimalReg

class FakeBackend(MinimalBackend):
    name = "FakeGPU"

class FakeGpu(MinimalDevice):
    name = "FakeGPU0"
    description = "a GPU that is not there"

    def init_backend(self, params=None):
        return FakeBackend(self)

class FakeReg(MinimalReg):
    name = "FakeGPU"

INITS = 0

def init():
    global INITS
    INITS += 1
    return FakeReg([FakeGpu()])
'''


def write_distribution(root, dist, module, source, entry_points):
    (root / f"{module}.py").write_text(source)
    info = root / f"{dist}-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pyggml.backends]\n" + "".join(f"{k} = {v}\n" for k, v in entry_points))


@pytest.fixture
def scratch_regs():
    """Unregister whatever a test registers (the CPU reg stays)."""
    before = registry.backends()
    yield
    for reg in registry.backends():
        if reg not in before:
            registry.unregister_backend(reg)


@pytest.fixture
def fake_dist(tmp_path, monkeypatch, scratch_regs):
    write_distribution(tmp_path, "fake_gpu_backend", "fake_gpu_backend", FAKE_MODULE,
                       [("fake", "fake_gpu_backend:init")])
    write_distribution(tmp_path, "broken_backend", "broken_backend", "raise ImportError('no driver')\n",
                       [("broken", "broken_backend:init")])
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ("fake_gpu_backend", "broken_backend", "unsupported_backend"):
        sys.modules.pop(name, None)


def test_cpu_is_registered_on_import():
    assert cpu.CPU_REG in registry.backends()
    assert registry.reg_by_name("cpu") is cpu.CPU_REG is registry.backend_by_name("CPU")
    assert registry.device_by_name("cPu") is cpu.CPU_REG.device(0)
    assert registry.device_by_type(DeviceType.CPU) is cpu.CPU_REG.device(0)
    assert registry.device_by_name("nope") is None and registry.reg_by_name("nope") is None


def test_init_functions():
    assert cpu.is_cpu(registry.init_by_name("CPU"))
    assert cpu.is_cpu(registry.init_by_type(DeviceType.CPU))
    with pytest.raises(BackendError, match="no device named 'Metal'; registered devices: .*CPU \\(CPU\\)"):
        registry.init_by_name("Metal")
    with pytest.raises(BackendError, match="no device of type ACCEL"):
        registry.init_by_type(DeviceType.ACCEL)


def test_duplicates_are_ignored_and_init_best_prefers_gpu(scratch_regs):
    assert cpu.is_cpu(registry.init_best())
    dev = MinimalDevice()  # a GPU
    reg = MinimalReg([dev])
    n_regs, n_devs = len(registry.backends()), len(registry.devices())
    registry.register_backend(reg)
    registry.register_backend(reg)
    registry.register_device(dev)
    registry.register_backend(None)
    assert len(registry.backends()) == n_regs + 1 and len(registry.devices()) == n_devs + 1
    assert registry.backends()[-1] is reg and registry.devices()[-1] is dev
    assert registry.init_best().device is dev
    registry.unregister_backend(reg)
    assert dev not in registry.devices() and cpu.is_cpu(registry.init_best())


def test_init_best_takes_an_igpu_before_the_cpu(scratch_regs):
    class Igpu(MinimalDevice):
        name = "IGPU0"
        type = DeviceType.IGPU

    registry.register_backend(MinimalReg([igpu := Igpu()]))
    assert registry.init_best().device is igpu


def test_load_all_from_an_installed_distribution(fake_dist):
    with pytest.warns(RuntimeWarning, match="broken_backend:init.*no driver"):
        loaded = registry.load_all()
    assert [r.name for r in loaded if r.name != "TORCH"] == ["FakeGPU"]  # pyggml's torch entry point too
    assert registry.device_by_name("fakegpu0").description == "a GPU that is not there"
    backend = registry.init_best()
    assert backend.name == "FakeGPU" and backend.device.reg is loaded[0]


def test_load_backend_by_module_name_and_score_zero(fake_dist):
    reg = registry.load_backend("fake_gpu_backend")
    assert reg is registry.reg_by_name("FakeGPU")
    (fake_dist / "unsupported_backend.py").write_text(FAKE_MODULE + "\ndef score():\n    return 0\n")
    assert registry.load_backend("unsupported_backend:init") is None


def test_load_backend_refusals(fake_dist):
    (fake_dist / "wrong_backend.py").write_text(textwrap.dedent('''
        from pyggml.backend.base import BackendReg
        class Old(BackendReg):
            name = "old"
            api_version = 1
        def init():
            return Old()
        def not_a_reg():
            return 42
    '''))
    with pytest.raises(BackendError, match="API version 1, expected 2"):
        registry.load_backend("wrong_backend")
    with pytest.raises(BackendError, match="returned 42, not a BackendReg"):
        registry.load_backend("wrong_backend:not_a_reg")
    with pytest.raises(BackendError, match="cannot load 'no_such_module_xyz'"):
        registry.load_backend("no_such_module_xyz")
    sys.modules.pop("wrong_backend", None)


@pytest.fixture
def plugins_not_loaded(monkeypatch):
    """As in a fresh process: the installed entry points have not been loaded yet."""
    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_loaded", {})


def test_an_installed_plugin_is_found_by_name_without_load_all(fake_dist, plugins_not_loaded):
    with pytest.warns(RuntimeWarning, match="no driver"):
        backend = registry.init_by_name("FakeGPU0")
    assert backend.name == "FakeGPU"
    assert registry.reg_by_name("fakegpu") is backend.device.reg
    listed = "registered devices: .*CPU \\(CPU\\).*FakeGPU0 \\(GPU\\)"
    with pytest.raises(BackendError, match=f"no device named 'Metal'; {listed}"):
        registry.init_by_name("Metal")


def test_init_by_type_and_init_best_load_the_plugins(fake_dist, plugins_not_loaded):
    with pytest.warns(RuntimeWarning, match="no driver"):
        assert registry.init_by_type(DeviceType.GPU).name == "FakeGPU"
    registry.unregister_backend(registry.reg_by_name("FakeGPU"))
    assert registry.init_best().name == "FakeGPU"  # unregistered, then loaded again by init_best


def test_load_all_is_idempotent(fake_dist, plugins_not_loaded):
    with pytest.warns(RuntimeWarning, match="no driver"):
        first = registry.load_all()
    n_regs, n_devs = len(registry.backends()), len(registry.devices())
    assert registry.load_all() == first  # no second warning, no second init()
    assert registry.device_by_name("no such device") is None  # a miss after load_all loads nothing again
    assert sys.modules["fake_gpu_backend"].INITS == 1
    assert (len(registry.backends()), len(registry.devices())) == (n_regs, n_devs)


def test_a_fresh_process_finds_the_torch_device_by_name():
    """`pyggml devices` lists TORCH_CPU; init_by_name finds it too, with no import of the torch backend first."""
    pytest.importorskip("torch")
    repo = Path(__file__).resolve().parents[2]
    code = ("import sys; import pyggml as gg; assert 'pyggml.backend.torch' not in sys.modules; "
            "print(gg.backend.init_by_name('TORCH_CPU').name)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(repo), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["TORCH_CPU"]
