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
    (["generate", "--ctx", "0"], "argument --ctx/-c: must be an integer >= 1, got 0"),
    (["generate", "--batch", "-2"], "argument --batch/-b: must be an integer >= 1, got -2"),
    (["chat", "--threads", "0"], "argument --threads/-t: must be an integer >= 1, got 0"),
    (["serve", "--port", "70000"], "argument --port: a TCP port is 0 to 65535, got 70000"),
    (["serve", "--parallel", "0"], "argument --parallel/-np: must be an integer >= 1, got 0"),
    (["serve", "--ctx", "0"], "argument --ctx/-c: must be an integer >= 1, got 0"),
    (["plan", "g.json", "--planner", "fast"], "argument --planner: invalid choice: 'fast'"),
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


def test_version_and_defaults_in_help(capsys):
    from pyggml.cli.main import package_version

    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out.strip() == f"pyggml {package_version()}"
    for command in ("generate", "chat", "serve"):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert "(default: 4096)" in text and "(default: smollm2-135m-instruct)" in text and "--threads" in text


def test_ctrl_c_ends_a_command_in_one_line(monkeypatch, capsys):
    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr("pyggml.cli.devices.run", interrupted)
    assert main(["devices"]) == 130
    assert capsys.readouterr().err == "pyggml devices: interrupted\n"
