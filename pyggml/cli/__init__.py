"""The `pyggml` command."""
