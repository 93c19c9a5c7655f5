"""Writes llama.cpp's mtmd outputs on the vision parity cases (tests/models/vision/cases.py) to mtmd_refs.npz and
the files' checksums to mtmd_refs.json; with them the inputs of each encoder run's GELUs, as the F16 bits ggml's
GELU table is read at (`<case>/gelu_inputs/<run>`, stacked in graph order). Needs llama-cpp-python (the `llamacpp`
extra):

    python -m tests.models.vision.data.make_mtmd_refs
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np

from pyggml.testing.mtmd import mtmd_reference
from tests.models.vision.cases import CASES, N_CTX, TEXT, sha256

DATA = Path(__file__).parent


def main() -> None:
    arrays, summary = {}, {}
    with tempfile.TemporaryDirectory() as folder:
        for case in CASES:
            lm, mmproj = case.write(Path(folder))
            ref = mtmd_reference(lm, mmproj, TEXT, [case.image()], n_ctx=N_CTX, gelu_inputs=True)
            runs = ref.pop("gelu_inputs")
            arrays |= {f"{case.name}/{key}": value for key, value in ref.items()}
            arrays |= {f"{case.name}/gelu_inputs/{i}": np.stack(run).astype(np.float16).view(np.uint16)
                       for i, run in enumerate(runs)}
            summary[case.name] = {"lm_sha256": sha256(lm), "mmproj_sha256": sha256(mmproj)}
            print(case.name, {k: v.shape for k, v in ref.items()})
    np.savez_compressed(DATA / "mtmd_refs.npz", **arrays)
    (DATA / "mtmd_refs.json").write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
