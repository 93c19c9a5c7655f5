"""llama-cpp-python's OpenAI server (`python -m llama_cpp.server`, the peer of `pyggml serve`) with llama.cpp's
extra buffer types on (CPU_REPACK's kernels: llama.cpp at its best), or off with --no-extra-bufts (a
llama.cpp built with AMX crashes decoding on a CPU that reports AMX without granting its tile state). Same
command line as llama_cpp.server otherwise:

    python -m pyggml.testing.llamacpp_server --model FILE --n_threads 2 --n_batch 512 --port 8001
"""

from __future__ import annotations

import contextlib
import sys

from pyggml.errors import GGMLError
from pyggml.testing.llamacpp import no_extra_buffer_types

NO_EXTRA_BUFTS = "--no-extra-bufts"


def main() -> None:
    try:
        import llama_cpp
        from llama_cpp.server.__main__ import main as serve
    except ImportError:
        raise GGMLError("llama-cpp-python's server needs: pip install 'llama-cpp-python[server]'") from None
    plain = NO_EXTRA_BUFTS in sys.argv
    sys.argv = [a for a in sys.argv if a != NO_EXTRA_BUFTS]
    # the model loads inside serve(), before uvicorn starts
    with no_extra_buffer_types(llama_cpp.llama_cpp) if plain else contextlib.nullcontext():
        serve()


if __name__ == "__main__":
    main()
