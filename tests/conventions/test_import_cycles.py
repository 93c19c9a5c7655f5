"""No two modules of the same folder under pyggml/ import each other, directly or around a circle: each folder reads
from its foundations up. Checked on the source text, so a lazy import inside a function counts too (it hides a
circle from Python, not from the reader). A package's __init__ gathers its folder and is left out."""

import ast
from pathlib import Path

import pyggml

PACKAGE = Path(pyggml.__file__).resolve().parent


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def imported_names(path: Path) -> set[str]:
    """Every dotted name the file imports (relative imports resolved; `from a import b` gives a and a.b, as b may be
    a module)."""
    here = module_name(path).split(".")[:-1]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[:len(here) - node.level + 1] + [node.module or ""] if node.level else [node.module])
            base = base.rstrip(".")
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def same_folder_imports() -> dict[str, set[str]]:
    """module -> the modules of its own folder it imports (packages' __init__ left out)."""
    by_folder: dict[Path, dict[str, Path]] = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name != "__init__.py":
            by_folder.setdefault(path.parent, {})[module_name(path)] = path
    graph = {}
    for modules in by_folder.values():
        for name, path in modules.items():
            graph[name] = {other for other in imported_names(path) if other in modules and other != name}
    return graph


def find_circle(graph: dict[str, set[str]]) -> list[str] | None:
    """One circle of the graph as [a, b, ..., a], or None (depth-first search, iterative)."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    for root in sorted(graph):
        if root in state:
            continue
        path, stack = [root], [iter(sorted(graph[root]))]
        state[root] = 1
        while stack:
            nxt = next(stack[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif nxt not in state:
                state[nxt] = 1
                path.append(nxt)
                stack.append(iter(sorted(graph[nxt])))
    return None


def test_the_circle_finder_finds_a_circle():
    assert find_circle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_circle({"a": {"b"}, "b": set()}) is None


def test_no_import_circle_inside_a_folder():
    assert find_circle(same_folder_imports()) is None
