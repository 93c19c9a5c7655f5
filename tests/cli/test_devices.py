"""`pyggml devices`: every registered backend and device is listed with its type, memory and caps."""

import argparse

from pyggml.cli import devices


def run_devices(capsys, *argv):
    parser = argparse.ArgumentParser()
    devices.add_parser(parser.add_subparsers())
    args = parser.parse_args(["devices", *argv])
    assert args.run(args) == 0
    return capsys.readouterr().out


def test_lists_the_cpu_device(capsys):
    out = run_devices(capsys, "--no-plugins")
    lines = out.splitlines()
    assert lines[0] == "CPU (1 device)"
    assert lines[1].startswith("  CPU: CPU, ")
    assert "MiB free /" in lines[2] and lines[3] == "    caps: buffer_from_host_ptr"
