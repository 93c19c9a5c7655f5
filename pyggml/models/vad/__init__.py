"""Voice activity detection: Silero VAD v6 on pyggml graphs (silero.py), its weight files (files.py) and the
speech segments cut from its probabilities (segments.py)."""
