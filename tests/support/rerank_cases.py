"""The random-weight reranker files /v1/rerank is checked on against llama.cpp (tests/serve/data/
llamacpp_rerank.json, written by tests/serve/data/make_rerank_refs.py): a bert with a one-score head and bge's
WordPiece vocabulary (pairs as [CLS] query [SEP] document), and a Qwen3-Reranker ("yes"/"no" head) whose file
holds a `tokenizer.chat_template.rerank` as Qwen3-Reranker's conversion writes one (shortened: the test
vocabulary's byte-level tokens make long prompts), so its pairs come from the template."""

from __future__ import annotations

from functools import partial
from pathlib import Path

from gguf import GGUFValueType

from pyggml.testing.synthetic import Vocab, write_qwen3

from tests.support.embedding_cases import BY_NAME, N_CTX
from tests.support.tiny_models import bpe_vocab

QUERY = "Machine learning is"
DOCUMENTS = ["A machine is a physical system.", "Learning is acquiring knowledge.",
             "Machine learning is a field of study in artificial intelligence.", "Paris, capitale de la France."]
# llama.cpp's tools/server/tests/unit/test_rerank.py (MIT, The ggml authors): its query and documents, for the
# ported test (tests/serve/llamacpp_ported_compat/test_rerank.py); scored by llama.cpp on the bert file
LLAMACPP_TEST_DOCUMENTS = [
    'A machine is a physical system that uses power to apply forces and control movement to perform an '
    'action. The term is commonly applied to artificial devices, such as those employing engines or '
    'motors, but also to natural biological macromolecules, such as molecular machines.',
    'Learning is the process of acquiring new understanding, knowledge, behaviors, skills, values, '
    'attitudes, and preferences. The ability to learn is possessed by humans, non-human animals, and some'
    ' machines; there is also evidence for some kind of learning in certain plants.',
    'Machine learning is a field of study in artificial intelligence concerned with the development and '
    'study of statistical algorithms that can learn from data and generalize to unseen data, and thus '
    'perform tasks without explicit instructions.',
    "Paris, capitale de la France, est une grande ville européenne et un centre mondial de l'art, de la "
    'mode, de la gastronomie et de la culture. Son paysage urbain du XIXe siècle est traversé par de '
    'larges boulevards et la Seine.',
]
LLAMACPP_TEST_QUERY = "Machine learning is"
RERANK_TEMPLATE = "<|im_start|>Q: {query}\nD: {document}<|im_end|>\nA:"  # Qwen3-Reranker's form, shortened


def _qwen3_vocab() -> Vocab:
    vocab = bpe_vocab("qwen2")
    return Vocab({**vocab.keys, "tokenizer.chat_template.rerank": (RERANK_TEMPLATE, GGUFValueType.STRING, None)})


CASES = {
    "bert-rank": BY_NAME["bert-f32-rank"].write,
    "qwen3-rank-template": partial(write_qwen3, vocab=_qwen3_vocab(), n_vocab=459, n_ctx=N_CTX,
                                   classifier=("yes", "no"), seed=43),
}


def write_case(name: str, directory: Path) -> Path:
    return CASES[name](Path(directory) / f"{name}.gguf")
