"""CPU kernels for unary activations and GLUs against float64 formulas (ggml's NMSE 1e-7)."""

import numpy as np
import pytest
from tests.support.opcases_unary import CASES, gelu
from tests.support.opcheck import check, compute, nmse

from pyggml.backend.cpu import kernels
from pyggml.backend.cpu.kernels import unary as K
from pyggml.core import ops
from pyggml.core.context import Context
from pyggml.core.tensor import GluOp, host_ndarray
from pyggml.core.types import GGMLType as G


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_reference(case):
    check(case)



def test_round_sends_halves_away_from_zero_like_roundf():
    ctx = Context()
    x = ctx.tensor_from_numpy(np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.49999997, -0.49999997], np.float32))
    np.testing.assert_array_equal(host_ndarray(compute(ops.round(ctx, x))).ravel(), [-3, -2, -1, 1, 2, 3, 0, 0])


def test_gelu_uses_ggml_f16_table_and_its_cutoffs():
    """ggml's CPU gelu is the tanh formula at the input rounded to F16, rounded to F16; 0 / x beyond +-10."""
    ctx = Context()
    xs = np.array([-12, -10, -3.3, -0.1234567, 0.7654321, 2.2, 10, 11.5], np.float32)
    got = host_ndarray(compute(ops.gelu(ctx, ctx.tensor_from_numpy(xs)))).ravel()
    x16 = xs.astype(np.float16).astype(np.float64)
    expected = gelu(x16).astype(np.float16).astype(np.float32)
    expected[xs <= -10], expected[xs >= 10] = 0, xs[xs >= 10]
    np.testing.assert_array_equal(got, expected)


def test_gelu_table_stays_close_to_the_exact_formula_over_a_wide_range():
    x = np.linspace(-9, 9, 20001, dtype=np.float32)
    assert nmse(gelu(x.astype(np.float64)), K.gelu(x)) < 1e-6


def test_erfc_is_accurate():
    import math

    x = np.linspace(-6, 6, 1201)
    exact = np.array([math.erfc(v) for v in x])
    assert np.max(np.abs(K.erfc(x) - exact) / exact) < 2e-7


def test_unary_refuses_integer_and_mismatched_types():
    ctx = Context()
    assert not kernels.supports(ops.relu(ctx, ctx.new_tensor(G.I32, (4,))))
    assert not kernels.supports(ops.gelu(ctx, ctx.new_tensor(G.BF16, (4,))))  # ggml has F32/F16 GELU kernels only
    assert kernels.supports(ops.relu(ctx, ctx.new_tensor(G.BF16, (4,))))
    out = ops.relu(ctx, ctx.new_tensor(G.F32, (4,)))
    out.type = G.F16  # F32 -> F16 is not one of ggml's unary pairs
    assert not kernels.supports(out)


def test_swiglu_oai_needs_f32():
    ctx = Context()
    assert not kernels.supports(ops.swiglu_oai(ctx, ctx.new_tensor(G.F16, (8, 2)), None, 1.0, 7.0))
    assert kernels.supports(ops.swiglu(ctx, ctx.new_tensor(G.F16, (8, 2))))
    split = ops.swiglu_split(ctx, ctx.new_tensor(G.F32, (8, 2)), ctx.new_tensor(G.F32, (8, 2)))
    split.src[1] = ctx.new_tensor(G.F16, (8, 2))  # as a graph file could have it: ggml has no such kernel
    assert not kernels.supports(split)


def test_gelu_tables_are_ggmls_entry_for_entry():
    """ggml's CPU GELU and GELU_QUICK over every finite F16 input (data/make_ggml_gelu_tables.py), bit for bit. ggml
    fills its tables with the C library's tanhf and expf, so they are compared where that C library made them."""
    import platform
    from pathlib import Path

    with np.load(Path(__file__).parent / "data" / "ggml_gelu_tables.npz") as f:
        libc, tables = str(f["libc"]), {name: f[name] for name in ("gelu", "gelu_quick")}
    if " ".join(platform.libc_ver()) != libc:
        pytest.skip(f"the tables were made with {libc}'s tanhf and expf")
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
    finite = np.isfinite(x)
    for name, fn in (("gelu", K.gelu), ("gelu_quick", K.gelu_quick)):
        got, want = fn(x[finite]).astype(np.float16).view(np.uint16), tables[name][finite]
        assert np.array_equal(got, want), f"{name}: {np.sum(got != want)} entries differ"


def test_only_gelu_kinds_build_the_gelu_table():
    """SwiGLU and SiLU (a llama's step) run without ggml's GELU table; GEGLU builds it at its first bind."""
    K.f16_table.cache_clear()
    ctx = Context()
    values = np.linspace(-4, 4, 64, dtype=np.float32).reshape(2, 32)
    x = ctx.tensor_from_numpy(values)
    silu_glu = ops.glu(ctx, x, GluOp.SWIGLU, False)
    kernels.bound(silu_glu, kernels.KERNELS[silu_glu.op])()
    assert K.f16_table.cache_info().currsize == 0
    a, gate = values[:, :16].astype(np.float64), values[:, 16:]
    np.testing.assert_allclose(host_ndarray(silu_glu).reshape(2, 16), a / (1 + np.exp(-a)) * gate, rtol=1e-5)
    gelu_glu = ops.glu(ctx, x, GluOp.GEGLU, False)
    kernels.bound(gelu_glu, kernels.KERNELS[gelu_glu.op])
    assert K.f16_table.cache_info().currsize == 1
