"""The wire format: struct sizes as ggml packs them, rpc_tensor and graph round trips, FNV-1a."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pyggml.backend.rpc import protocol as P
from pyggml.errors import RPCError


def fnv_reference(data: bytes) -> int:
    h = P.FNV_OFFSET
    for b in data:
        h = ((h ^ b) * P.FNV_PRIME) & (2**64 - 1)
    return h


def test_struct_sizes_match_ggml_packing():
    # sizeof() of ggml 0.15.3's #pragma pack(1) structs
    assert P.TENSOR.size == 296
    assert P.HELLO_REQ.size == 24 and P.HELLO_RSP.size == 28
    assert P.ALLOC_BUFFER_REQ.size == 12 and P.BUFFER_CLEAR_REQ.size == 9
    assert P.TENSOR_OFFSET_U64.size == 312 and P.COPY_TENSOR_REQ.size == 592
    assert P.GET_ALLOC_SIZE_REQ.size == 4 + 11 * 296
    assert int(P.Cmd.HELLO) == 14 and len(P.Cmd) == 17


u64 = st.integers(0, 2**64 - 1)
u32 = st.integers(0, 2**32 - 1)
i32 = st.integers(-(2**31), 2**31 - 1)
wire_tensors = st.builds(
    P.WireTensor, id=u64, type=u32, buffer=u64, ne=st.lists(u32, min_size=4, max_size=4),
    nb=st.lists(u32, min_size=4, max_size=4), op=u32, op_params=st.lists(i32, min_size=16, max_size=16),
    flags=i32, src=st.lists(u64, min_size=10, max_size=10), view_src=u64, view_offs=u64, data=u64,
    name=st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=63))


@given(wire_tensors)
def test_rpc_tensor_round_trip(t):
    raw = t.pack()
    assert len(raw) == 296
    assert P.WireTensor.unpack(raw) == t


def test_rpc_tensor_field_offsets():
    t = P.WireTensor(id=1, type=2, buffer=3, ne=[4, 5, 6, 7], nb=[8, 9, 10, 11], op=12, op_params=list(range(16)),
                     flags=16, src=list(range(100, 110)), view_src=200, view_offs=300, data=400, name="x")
    raw = t.pack()
    # offsets of ggml's packed rpc_tensor: id 0, type 8, buffer 12, ne 20, nb 36, op 52, op_params 56,
    # flags 120, src 124, view_src 204, view_offs 212, data 220, name 228, padding 292
    assert int.from_bytes(raw[12:20], "little") == 3
    assert int.from_bytes(raw[52:56], "little") == 12
    assert int.from_bytes(raw[124:132], "little") == 100
    assert int.from_bytes(raw[220:228], "little") == 400
    assert raw[228:230] == b"x\0" and raw[292:] == bytes(4)


@given(st.lists(u64, max_size=5), st.lists(wire_tensors, max_size=3), u32)
def test_graph_round_trip(nodes, tensors, device):
    g = P.WireGraph(device, nodes, tensors)
    assert P.WireGraph.unpack(g.pack()) == g


def test_truncated_graph_is_refused():
    raw = P.WireGraph(0, [1, 2], [P.WireTensor.unpack(P.NULL_TENSOR)]).pack()
    for cut in (4, 12, len(raw) - 1):
        with pytest.raises(RPCError):
            P.WireGraph.unpack(raw[:cut])


@pytest.mark.parametrize("n", [0, 1, 2, 255, 4097, (1 << 20) + 3])
def test_fnv1a_matches_the_byte_loop(n):
    data = np.random.default_rng(n).integers(0, 256, n, dtype=np.uint8).tobytes()
    assert P.fnv1a_64(data) == fnv_reference(data)


def test_fnv1a_known_values():
    assert P.fnv1a_64(b"") == 0xCBF29CE484222325
    assert P.fnv1a_64(b"a") == 0xAF63DC4C8601EC8C  # the published FNV-1a 64 test vector
