"""RPC test fixtures: ggml's own RPC server (ggml-python's libggml-rpc.so) and pyggml's, on free loopback ports."""

import pytest

from pyggml.backend import rpc
from pyggml.backend.cpu import CPU_REG


@pytest.fixture(scope="session")
def ggml_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("ggml-rpc-cache")


@pytest.fixture(scope="session")
def ggml_endpoint(ggml_cache_dir):
    """ggml's rpc-server on its CPU device, with a tensor cache (killed at the end of the session)."""
    pytest.importorskip("ggml", reason="ggml-python (ggml's RPC server) is not installed")
    from tests.support.ggml_rpc import ggml_server

    with ggml_server(str(ggml_cache_dir)) as server:
        yield server.endpoint


@pytest.fixture(scope="session")
def pyggml_cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("pyggml-rpc-cache")


@pytest.fixture(scope="session")
def pyggml_server(pyggml_cache_dir):
    """pyggml's RPC server on the CPU device, in this process (a thread per connection)."""
    with rpc.RPCServer([CPU_REG.device(0)], cache_dir=str(pyggml_cache_dir),
                       limits=rpc.Limits(request_timeout=5.0)) as server:
        server.start()
        yield server


@pytest.fixture(params=["ggml", "pyggml"])
def endpoint(request):
    """Each client test runs against ggml's server and against pyggml's."""
    if request.param == "ggml":
        return request.getfixturevalue("ggml_endpoint")
    return request.getfixturevalue("pyggml_server").endpoint


@pytest.fixture
def device(endpoint):
    (dev,) = rpc.add_server(endpoint, timeout=20.0)
    return dev


@pytest.fixture(scope="module", autouse=True)
def forget_rpc_servers():
    """The RPC devices are GPUs to the registry: drop them after each module so that other tests' init_best()
    stays the CPU."""
    yield
    for endpoint in rpc.RPC_REG.endpoints:
        rpc.RPC_REG.remove_server(endpoint)
