"""The package layers import only rightwards: cli -> serve -> models -> sched -> alloc -> backend -> core.

Checked on the source text (every `import pyggml.x` / `from pyggml.x`), so a lazy import inside a function
counts too. `pyggml.testing` serves tests and benchmarks and may import any layer; no layer imports it;
`pyggml.errors` is below every layer."""

import ast
from pathlib import Path

import pyggml

PACKAGE = Path(pyggml.__file__).resolve().parent
LAYERS = ["cli", "serve", "models", "sched", "alloc", "backend", "core"]


def imported_pyggml_packages(path: Path) -> set[str]:
    """The second component of every pyggml module the file imports (absolute or relative)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    here = path.relative_to(PACKAGE.parent).with_suffix("").parts
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level]
                names = [".".join(base + ((node.module,) if node.module else ()))]
            else:
                names = [node.module or ""]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == "pyggml" and len(parts) > 1:
                found.add(parts[1])
    return found


def layer_of(path: Path) -> str | None:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else None


def test_every_layer_imports_only_the_layers_to_its_right():
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        layer = layer_of(path)
        if layer not in LAYERS:
            continue
        allowed = set(LAYERS[LAYERS.index(layer):]) | {"errors"}
        for target in imported_pyggml_packages(path) - allowed:
            wrong.append(f"{path.relative_to(PACKAGE.parent)} ({layer}) imports pyggml.{target}")
    assert wrong == []


def imported_pyggml_modules(path: Path) -> set[str]:
    """Every pyggml module the file imports, dotted (absolute imports; `from pyggml.x import y` gives pyggml.x.y
    too, as y may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.startswith("pyggml.")}


def test_only_the_backend_layer_imports_the_cpu_backend():
    """Above the backend layer, threads and kernel loading go through a backend's extension functions
    (pyggml.backend.extensions), and compiling through pyggml.core.jit: no reach into the CPU backend."""
    wrong = [f"{path.relative_to(PACKAGE.parent)} imports {name}"
             for path in sorted(PACKAGE.rglob("*.py")) if layer_of(path) != "backend"
             for name in sorted(imported_pyggml_modules(path))
             if name == "pyggml.backend.cpu" or name.startswith("pyggml.backend.cpu.")]
    assert wrong == []


def test_no_layer_imports_the_testing_helpers():
    users = [str(p.relative_to(PACKAGE.parent)) for p in PACKAGE.rglob("*.py")
             if layer_of(p) in LAYERS and "testing" in imported_pyggml_packages(p)]
    assert users == []


def test_the_checker_sees_a_wrong_import(tmp_path):
    """The check itself: an upward import, absolute or relative, is found; so is a reach into the CPU backend."""
    fake = PACKAGE / "core" / "__layering_probe__.py"
    fake.write_text("from pyggml.models import load_model\nfrom ..sched import Scheduler\n"
                    "from pyggml.backend import cpu\nimport pyggml.backend.cpu.jit\n")
    try:
        assert imported_pyggml_packages(fake) == {"models", "sched", "backend"}
        assert {"pyggml.backend.cpu", "pyggml.backend.cpu.jit"} <= imported_pyggml_modules(fake)
    finally:
        fake.unlink()
