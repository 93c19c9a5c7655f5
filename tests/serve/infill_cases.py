"""The /infill requests whose prompt tokens are checked against llama-server's construction: prefixes and
suffixes cut by the batch, extra files cut by the context, a prompt, both token orders (spm_infill)."""

CODE_PREFIX = "import os\n\n\ndef read_all(paths):\n    out = []\n    for p in paths:\n        with open(p) as f:\n"
CODE_SUFFIX = "\n    return out\n\n\nif __name__ == '__main__':\n    print(read_all(os.listdir('.')))\n"
EXTRA = [["util.py", "def helper(x):\n    return x * 2\n"], ["notes.md", "# Notes\nread files, then sum.\n"]]

CASES = [
    {"prefix": CODE_PREFIX, "suffix": CODE_SUFFIX, "extra": [], "prompt": "", "n_batch": 512, "n_ctx": 512,
     "n_predict": -1, "spm": False},
    {"prefix": CODE_PREFIX, "suffix": CODE_SUFFIX, "extra": EXTRA, "prompt": "", "n_batch": 64, "n_ctx": 512,
     "n_predict": -1, "spm": False},
    {"prefix": CODE_PREFIX * 3, "suffix": CODE_SUFFIX * 3, "extra": EXTRA, "prompt": "            out.append(",
     "n_batch": 64, "n_ctx": 128, "n_predict": 16, "spm": False},
    {"prefix": CODE_PREFIX, "suffix": CODE_SUFFIX, "extra": EXTRA, "prompt": "", "n_batch": 64, "n_ctx": 512,
     "n_predict": -1, "spm": True},
    {"prefix": "", "suffix": "", "extra": [["empty.txt", ""]], "prompt": "", "n_batch": 32, "n_ctx": 256,
     "n_predict": -1, "spm": False},
]
