"""`pyggml devices`: the registered backends and their devices, with type, memory and capabilities."""

from __future__ import annotations

from pyggml import backend
from pyggml.errors import GGMLError

MIB = 1024 * 1024


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("devices", help="list backends and devices")
    p.add_argument("--no-plugins", action="store_true",
                   help="do not load third-party backends from the 'pyggml.backends' entry points")
    p.set_defaults(run=run)


def describe(dev: backend.Device) -> str:
    try:
        props = dev.props()
    except GGMLError as e:  # e.g. an RPC server that went away: the other devices are still listed
        return f"  {dev.name}: unreachable ({e})"
    caps = [name.rstrip("_") for name, on in vars(props.caps).items() if on] or ["none"]
    return (f"  {props.name}: {props.type.name}, {props.description}\n"
            f"    memory: {props.memory_free // MIB} MiB free / {props.memory_total // MIB} MiB total\n"
            f"    caps: {', '.join(caps)}")


def run(args) -> int:
    if not args.no_plugins:
        backend.load_all()
    for reg in backend.backends():
        print(f"{reg.name} ({reg.device_count} device{'s' if reg.device_count != 1 else ''})")
        for i in range(reg.device_count):
            print(describe(reg.device(i)))
    return 0
