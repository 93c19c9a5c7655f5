"""llama-cpp-python's OpenAI server (`python -m llama_cpp.server`, the peer of `pyggml serve`) with llama.cpp's
extra buffer types off, as every other llama.cpp peer here: on a CPU that reports AMX, the repacked weights
crashed libggml-cpu when the server decoded. Same command line as llama_cpp.server:

    python -m pyggml.testing.llamacpp_server --model FILE --n_threads 2 --n_batch 512 --port 8001
"""

from __future__ import annotations

from pyggml.errors import GGMLError
from pyggml.testing.llamacpp import no_extra_buffer_types


def main() -> None:
    try:
        import llama_cpp
        from llama_cpp.server.__main__ import main as serve
    except ImportError:
        raise GGMLError("llama-cpp-python's server needs: pip install 'llama-cpp-python[server]'") from None
    with no_extra_buffer_types(llama_cpp.llama_cpp):  # the model loads inside serve(), before uvicorn starts
        serve()


if __name__ == "__main__":
    main()
