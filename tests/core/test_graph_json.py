import json

from pyggml import Graph, Op, load_graph_json, save_graph_json


def test_every_graph_file_round_trips(graph_files):
    for path in graph_files:
        doc = json.loads(path.read_text())
        lg = load_graph_json(path)
        assert lg.graph.n_nodes == doc["n_nodes"] and lg.graph.n_leafs == doc["n_leafs"]
        assert lg.to_json() == doc, path.name


def test_loaded_tensors_have_the_recorded_structure(graph_files):
    for path in graph_files:
        doc = json.loads(path.read_text())
        lg = load_graph_json(path)
        for e in doc["leafs"] + doc["nodes"]:
            t = lg.tensors[e["id"]]
            assert (t.type, t.ne, t.nb, int(t.flags), t.op.name) == (e["type"], e["ne"], e["nb"], e["flags"], e["op"])
            assert t.op_params == e["op_params"] and t.view_offs == e["view_offs"]
            assert (t.view_src is None) == (e["view_src"] is None)
            assert [None if s is None else lg.ids()[id(s)] for s in t.src[: len(e["srcs"])]] == e["srcs"]
        pre = {id(t) for t in lg.preallocated}
        assert pre == {id(lg.tensors[e["id"]]) for e in doc["leafs"] + doc["nodes"]
                       if e["preallocated"] and e["view_src"] is None}
        assert lg.expected.compute_buffer_size == doc["compute_buffer_size"]


def test_rebuilding_from_the_sinks_reproduces_ggmls_order(graph_files):
    """Expanding the unconsumed nodes in order rebuilds ggml's exact node and leaf order (same DFS)."""
    for path in graph_files:
        lg = load_graph_json(path)
        if "dag_spec" in lg.doc:  # the generator expanded its nodes in its own order
            continue
        consumed = {id(s) for t in lg.graph.nodes for s in t.srcs}
        g = Graph(size=lg.graph.size)
        for t in lg.graph.nodes:
            if id(t) not in consumed:
                g.build_forward_expand(t)
        assert g.nodes == lg.graph.nodes and g.leafs == lg.graph.leafs, path.name


def test_save_and_load_a_built_graph(tmp_path):
    from pyggml import Context, GGMLType
    ctx = Context(no_alloc=True)
    a = ctx.new_tensor_2d(GGMLType.F32, 4, 3, "a").set_input()
    b = ctx.dup_tensor(a, "b")
    b.op, b.src[0] = Op.UNARY, a
    b.set_op_params([6])
    b.set_output()
    g = Graph().build_forward_expand(b)
    save_graph_json(g, tmp_path / "g.json", name="tiny")
    lg = load_graph_json(tmp_path / "g.json")
    t = lg.tensors["N0"]
    assert t.op == Op.UNARY and t.unary_op.name == "RELU" and t.is_output and lg.tensors["L0"].is_input
    assert lg.to_json()["nodes"][0]["unary_op"] == "RELU"
