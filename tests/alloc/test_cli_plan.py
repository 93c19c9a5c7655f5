"""`pyggml plan GRAPH.json`: sizes, lower bound, ratio and ggml's size for a graph file, optionally a plot."""

import pytest

from pyggml.cli.main import main


@pytest.fixture(scope="module")
def decode_graph(graph_files):
    return next(p for p in graph_files if p.stem == "gpt2_small_decode")


def test_plan_prints_sizes_and_ratios(decode_graph, capsys):
    assert main(["plan", str(decode_graph)]) == 0
    out = capsys.readouterr().out
    assert "graph gpt2_small_decode:" in out
    assert "buffer 0: 1,605,632 bytes" in out
    assert "lower bound: 1,605,632 bytes; size / lower bound = 1.0000" in out
    assert "ggml's planner: 1,614,912 bytes (ratio 1.0058); recorded by ggml 0.15.3: 1,614,912" in out


def test_plan_with_ggml_planner_and_plot(decode_graph, capsys, tmp_path):
    pytest.importorskip("matplotlib")
    png = tmp_path / "plan.png"
    assert main(["plan", str(decode_graph), "--planner", "ggml", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "buffer 0: 1,614,912 bytes" in out and "(planner ggml, placement from ggml)" in out
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_plan_of_a_bad_file_is_an_error(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "something else"}')
    assert main(["plan", str(bad)]) == 2
    assert "format" in capsys.readouterr().err


def test_plan_with_reorder_reports_both_orders_and_plots_them_side_by_side(capsys, tmp_path):
    pytest.importorskip("matplotlib")
    from pathlib import Path
    png = tmp_path / "plans.png"
    wide = Path(__file__).resolve().parents[1] / "data" / "graphs" / "wide_dag.json"
    assert main(["plan", str(wide), "--reorder", "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    assert "LOAD in ggml's order: 19,730,432 bytes; in the chosen order: " in out
    chosen = int(out.split("in the chosen order: ")[1].split(" bytes")[0].replace(",", ""))
    assert chosen <= 0.9 * 19730432
    from matplotlib.image import imread
    height, width = imread(png).shape[:2]
    assert width > 2 * height  # two plans in one figure
