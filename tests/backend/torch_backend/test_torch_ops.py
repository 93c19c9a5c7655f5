"""The torch backend against the CPU backend on the CPU op cases (ggml's test-backend-ops, NMSE criteria).

Every case of tests/backend/cpu/opcases_*.py whose nodes the torch backend says it supports is
copied onto TORCH_CPU (graph_copy, so the real buffer path is used) and computed there; its output
must match the CPU kernels' output within the case's NMSE, with the same infinities and NaNs.
PYGGML_TORCH_DEVICE names another torch device to run them on (CUDA0 on a machine with a GPU).
The other cases are not collected (the scheduler runs those ops on the CPU); the ops the models need
must be among the supported ones.
"""


import os

import numpy as np
import pytest

pytest.importorskip("torch.cuda")  # "torch.cuda", not "torch": tests/backend/torch itself would import as "torch"


from tests.support import opcases_attention  # noqa: E402
from tests.support import opcases_conv  # noqa: E402
from tests.support import opcases_elementwise  # noqa: E402
from tests.support import opcases_layout  # noqa: E402
from tests.support import opcases_matmul  # noqa: E402
from tests.support import opcases_norm  # noqa: E402
from tests.support import opcases_reduce  # noqa: E402
from tests.support import opcases_unary  # noqa: E402
from tests.support.opcheck import compute, nmse, prepare, values  # noqa: E402

from pyggml.backend import init_by_name, tensor_get  # noqa: E402
from pyggml.backend.graph_copy import graph_copy  # noqa: E402
from pyggml.backend.torch import kernels  # noqa: E402
from pyggml.core import types as T  # noqa: E402
from pyggml.core.tensor import Op  # noqa: E402

CASES = [case for module in (opcases_attention, opcases_conv, opcases_elementwise, opcases_layout, opcases_matmul,
                             opcases_norm, opcases_reduce, opcases_unary) for case in module.CASES]

# The ops the models need; each must be supported in at least one of the cases above.
REQUIRED_OPS = {Op.MUL_MAT, Op.GET_ROWS, Op.CPY, Op.CONT, Op.DUP, Op.ADD, Op.SUB, Op.MUL, Op.DIV, Op.SCALE, Op.ADD1,
                Op.UNARY, Op.GLU, Op.NORM, Op.RMS_NORM, Op.L2_NORM, Op.SOFT_MAX, Op.ROPE, Op.FLASH_ATTN_EXT,
                Op.SET_ROWS, Op.ARGMAX, Op.SUM_ROWS, Op.MEAN, Op.CONCAT, Op.REPEAT, Op.DIAG_MASK_INF}


@pytest.fixture(scope="module")
def backend():
    b = init_by_name(os.environ.get("PYGGML_TORCH_DEVICE", "TORCH_CPU"))
    yield b
    b.free()


def torch_values(t) -> np.ndarray:
    """A tensor's values read back from its torch buffer, as float64 in ggml's reversed shape."""
    raw = tensor_get(t)
    if t.type in (T.GGMLType.I8, T.GGMLType.I16, T.GGMLType.I32, T.GGMLType.I64):
        return raw.astype(np.float64).reshape(tuple(reversed(t.ne)))
    return T.to_float(t.type, raw).reshape(tuple(reversed(t.ne))).astype(np.float64)


def supported(graph) -> bool:
    return all(kernels.supports(n) for n in graph.nodes)


def torch_runs(case) -> bool:
    """Whether the torch backend supports every node of the case's graph."""
    out, graph = prepare(case)
    return supported(graph) and out in graph.nodes


SUPPORTED_CASES = [case for case in CASES if torch_runs(case)]


def run_both(case, backend):
    """(CPU output, torch output) as float64 for one case the torch backend supports."""
    out, graph = prepare(case)
    copy = graph_copy(backend, graph)
    try:
        backend.graph_compute(copy.graph)
        actual = torch_values(copy.graph.nodes[graph.nodes.index(out)])
    finally:
        copy.free()
    compute(out, graph)
    return values(out), actual


@pytest.mark.parametrize("case", SUPPORTED_CASES, ids=lambda c: c.name)
def test_matches_cpu_backend(case, backend):
    expected, actual = run_both(case, backend)
    assert actual.shape == expected.shape
    assert np.array_equal(np.isnan(expected), np.isnan(actual)), f"{case.name}: NaNs differ"
    finite = np.isfinite(expected)
    assert np.array_equal(expected[~finite & ~np.isnan(expected)], actual[~finite & ~np.isnan(actual)]), \
        f"{case.name}: infinities differ"
    err = nmse(expected[finite], actual[finite])
    assert err <= case.tol, f"{case.name}: NMSE {err:.3g} > {case.tol:g}"


def test_required_ops_are_covered():
    covered = {n.op for case in SUPPORTED_CASES for n in prepare(case)[1].nodes}
    assert REQUIRED_OPS - covered == set()
