"""Every op case of tests/backend/cpu/opcases_*.py, computed by pyggml's CPU kernels and by ggml 0.15.3 on the
same inputs, compared with ggml's NMSE criterion (the case's tolerance): test-backend-ops with ggml as reference."""

import dataclasses

import pytest

pytest.importorskip("ggml", reason="ggml-python (the ggml peer) is not installed")

from pyggml.core.context import Context  # noqa: E402
from pyggml.core.tensor import Tensor, host_ndarray  # noqa: E402
from pyggml.errors import UnsupportedOpError  # noqa: E402

from tests.support.ggml_peer import IsolatedPeer, PeerCrashed  # noqa: E402

from tests.support import opcheck  # noqa: E402
from tests.support.all_opcases import all_cases  # noqa: E402

pytestmark = pytest.mark.peer
SEED = 0


@pytest.fixture(scope="module")
def peer():
    with IsolatedPeer(n_threads=2) as p:
        yield p


def ggml_values(peer, case):
    """The case's output as ggml computes it from the inputs opcheck fills (float64, like opcheck.values)."""
    out, graph = opcheck.prepare(case, SEED)
    inputs = {t: host_ndarray(t) for t in graph.leafs if t.view_src is None}
    (raw,) = peer.compute(graph, inputs, [out])
    host = Context().add(Tensor(out.type, out.ne, out.nb))
    host_ndarray(host)[...] = raw
    return opcheck.values(host)


@pytest.mark.parametrize("case", all_cases(), ids=lambda c: c.name)
def test_pyggml_matches_ggml(peer, case):
    try:
        expected = ggml_values(peer, case)
    except UnsupportedOpError as e:
        pytest.skip(f"not supported by ggml's CPU backend: {e}")
    except PeerCrashed as e:
        pytest.fail(f"ggml aborted on the graph pyggml built (pyggml's shape rules differ?): {e}")
    opcheck.check(dataclasses.replace(case, reference=lambda _out: expected), SEED)
