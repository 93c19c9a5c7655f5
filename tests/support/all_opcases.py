"""Every op case module of the CPU kernel tests, for the tests that run all of them on another backend."""

from tests.support import (opcases_attention, opcases_conv, opcases_elementwise, opcases_layout, opcases_matmul,
                           opcases_norm, opcases_reduce, opcases_unary)

MODULES = (opcases_attention, opcases_conv, opcases_elementwise, opcases_layout, opcases_matmul, opcases_norm,
           opcases_reduce, opcases_unary)


def all_cases(step: int = 1) -> list:
    """Each module's CASES, every `step`-th of them, in module order."""
    return [case for module in MODULES for case in module.CASES[::step]]
