"""GGUF files: the reader, the weights loader and the string table of their metadata."""
