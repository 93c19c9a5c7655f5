"""benchmarks/vnni_peak.py counts what its kernel computes: each round adds one vpdpbusd to every accumulator."""

import numpy as np
import pytest

from pyggml.backend.cpu.interleave import has_int8_products

pytestmark = pytest.mark.skipif(not has_int8_products(), reason="vpdpbusd needs AVX-512 VNNI (or its AVX2 form)")


@pytest.mark.parametrize("chains", [1, 8])
def test_each_round_is_one_vpdpbusd_on_every_accumulator(chains):
    from benchmarks.vnni_peak import spin_kernel

    from pyggml.backend.cpu.jit.ir.int8_ir import LANES

    out = np.ones(LANES, np.int32)  # as signed bytes: 1, 0, 0, 0 in each lane, against the unsigned 3s: 3 a round
    spin_kernel(chains)(1000, out)
    np.testing.assert_array_equal(out, chains * (chains - 1) // 2 + 3 * 1000 * chains)
