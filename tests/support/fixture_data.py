"""The project's test and benchmark fixtures (tests/data/), named one by one so that a missing file fails
tests/test_fixture_data.py instead of shrinking a glob or skipping the tests that need it."""

from pathlib import Path

DATA = Path(__file__).resolve().parents[1] / "data"
GRAPHS = DATA / "graphs"  # ggml-graph-json/1 files written by ggml 0.15.3, with its plans (graphs/FORMAT.md)
PLANNING = DATA / "planning"  # offset-planning instances, their sources and licences (planning/README.md)

GRAPH_NAMES = ("mlp_chain", "gpt2_small_prefill", "gpt2_small_decode", "llama_like_block_stack",
               "whisper_tiny_encoder_like", "wide_dag")
IN_PLACE_LOWER_BOUNDS = {  # bytes, as graphs/FORMAT.md lists them
    "mlp_chain": 262144, "gpt2_small_prefill": 104499200, "gpt2_small_decode": 1605632,
    "llama_like_block_stack": 15991808, "whisper_tiny_encoder_like": 63216000, "wide_dag": 19730432}
PLANNING_INSTANCES = ("G_1", "hard_A", "hard_B", "hard_C", "hard_D", "hard_E", "hard_F", "pangu_2.6B",
                      "paper_example", "resnet50")


def graph_path(name: str) -> Path:
    return GRAPHS / f"{name}.json"


def graph_paths() -> list[Path]:
    return [graph_path(name) for name in GRAPH_NAMES]


def planning_paths() -> list[Path]:
    return [PLANNING / f"{name}.csv" for name in PLANNING_INSTANCES]


def all_files() -> list[Path]:
    """Every fixture file the tests and benchmarks read, notes included."""
    return graph_paths() + planning_paths() + [GRAPHS / "FORMAT.md", PLANNING / "README.md"]
