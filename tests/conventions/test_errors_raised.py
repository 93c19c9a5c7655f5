"""Every exception class of pyggml.errors is raised by pyggml's code: a leaf class directly (`raise Name(`), a
base class directly or through a subclass that is. docs/errors.md documents exactly these classes."""

import ast
import inspect
import re
from pathlib import Path

import pyggml
from pyggml import errors

PACKAGE = Path(pyggml.__file__).resolve().parent
DOCS = PACKAGE.parent / "docs" / "errors.md"


def error_classes() -> dict[str, type]:
    return {name: cls for name, cls in vars(errors).items()
            if inspect.isclass(cls) and issubclass(cls, Exception) and cls.__module__ == errors.__name__}


def raised_names() -> set[str]:
    """Names called in a `raise` statement anywhere in the package (`raise X(...)`, `raise E.X(...)`)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call):
                func = node.exc.func
                names.add(func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", ""))
    return names


def test_every_error_class_is_raised():
    classes, raised = error_classes(), raised_names()
    never = [name for name, cls in classes.items()
             if name not in raised and not any(issubclass(c, cls) and n in raised for n, c in classes.items())]
    assert never == []
    leaves_never = [name for name, cls in classes.items() if name not in raised
                    and not any(c is not cls and issubclass(c, cls) for c in classes.values())]
    assert leaves_never == []


def test_no_error_class_shadows_a_builtin():
    import builtins
    assert [name for name in error_classes() if hasattr(builtins, name)] == []


def test_docs_list_exactly_the_error_classes():
    tree = DOCS.read_text().split("## The hierarchy", 1)[1]
    documented = set(re.findall(r"[├└]── (\w+)", tree)) | {"GGMLError"}
    documented.discard("Refused")  # pyggml.backend.rpc's, listed under RPCError
    assert documented == set(error_classes())
