"""Counts and ports on the command line: nonsense fails at parse time with one usage line naming the argument."""

import pytest

from pyggml.backend.cpu import CPU_REG
from pyggml.backend.rpc import RPCServer
from pyggml.cli.main import main
from pyggml.errors import ParameterError


@pytest.mark.parametrize("argv, fragment", [
    (["demo", "--n-embd", "-4"], "argument --n-embd: must be an integer >= 1, got -4"),
    (["demo", "--n-head", "0"], "argument --n-head: must be an integer >= 1, got 0"),
    (["demo", "--n-tokens", "x"], "argument --n-tokens: 'x' is not an integer"),
    (["rpc-server", "--port", "-5"], "argument --port/-p: must be an integer >= 0, got -5"),
    (["rpc-server", "--port", "70000"], "argument --port/-p: a TCP port is 0 to 65535, got 70000"),
    (["rpc-server", "--threads", "0"], "argument --threads/-t: must be an integer >= 1, got 0"),
    (["transcribe", "a.wav", "--beam-size", "0"], "argument --beam-size: must be an integer >= 1, got 0"),
    (["transcribe", "a.wav", "--threads", "-1"], "argument --threads/-t: must be an integer >= 1, got -1"),
    (["transcribe", "a.wav", "--audio-ctx-pad", "0"], "argument --audio-ctx-pad: must be an integer >= 1, got 0"),
])
def test_bad_counts_and_ports_are_usage_errors(capsys, argv, fragment):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and fragment in capsys.readouterr().err


def test_demo_refuses_heads_that_do_not_divide_the_width(capsys):
    assert main(["demo", "--n-head", "3"]) == 2
    assert "--n-embd (256) must be --n-head (3) heads of an even width" in capsys.readouterr().err


def test_demo_runs_with_small_sizes(capsys):
    assert main(["demo", "--n-embd", "64", "--n-tokens", "4"]) == 0


@pytest.mark.parametrize("kwargs, fragment", [({"port": -1}, "port must be 0"), ({"port": 65536}, "port must be 0"),
                                              ({"n_threads": 0}, "n_threads must be a positive integer")])
def test_rpc_server_refuses_bad_port_and_threads(kwargs, fragment):
    with pytest.raises(ParameterError, match=fragment):
        RPCServer([CPU_REG.device(0)], **kwargs)
