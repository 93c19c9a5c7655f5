"""/infill's prompt: fill-in-the-middle with the model's FIM tokens, built by llama-server's rules (its
format_prompt_infill) so that the same request gives the same tokens: the repo-level pattern

    [FIM_REP]myproject\\n [FIM_SEP]file0\\n extra0 ... [FIM_SEP]filename\\n [FIM_PRE]prefix [FIM_SUF]suffix [FIM_MID]

with the prefix cut to its last 3/4 of a batch, the suffix to what is left of the last quarter after the prompt,
and the extra chunks to what the context leaves after a batch and twice n_predict (their last tokens kept).
A model without FIM_SEP separates the chunks by a "--- snippet ---" line; without FIM_REP there is no project line."""

from __future__ import annotations

from pyggml.serve.protocol import APIError, Fields

SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"


def fim_tokens(tokenizer) -> dict:
    """The FIM ids the file names (tokenizer.ggml.fim_*_token_id) or the tokenizer found by their text; /infill
    needs prefix, suffix and middle."""
    ids = tokenizer.fim_ids
    missing = [what for what, key in (("prefix", "fim_pre"), ("suffix", "fim_suf"), ("middle", "fim_mid"))
               if ids.get(key) is None]
    if missing:
        raise APIError(f"Infill is not supported by this model: its {', '.join(missing)} token is missing",
                       status=501, kind="not_supported_error")
    return ids


def read_extra(f: Fields) -> list[tuple[str, str]]:
    """`input_extra`: [{"filename", "text"}] (filename optional, "tmp" as llama-server)."""
    out = []
    for i, chunk in enumerate(f.get("input_extra", list, [])):
        c = Fields(chunk, f"input_extra[{i}]")
        out.append((c.get("filename", str, "tmp"), c.get("text", str, required=True)))
    return out


def infill_prompt(tokenizer, prefix: str, suffix: str, extra: list[tuple[str, str]], prompt: list[int],
                  n_batch: int, n_ctx: int, n_predict: int = -1, spm: bool = False) -> list[int]:
    """The token ids of an infill request (llama-server's format_prompt_infill; `n_ctx` is a slot's context,
    `n_predict` the server's default, -1 as llama-server's)."""
    ids = fim_tokens(tokenizer)

    def tok(text: str) -> list[int]:
        return tokenizer.encode(text, add_special=False, parse_special=False)

    extra_tokens: list[int] = []
    if ids.get("fim_rep") is not None:
        extra_tokens += [ids["fim_rep"], *tok("myproject\n")]
    for filename, text in extra:
        if ids.get("fim_sep") is not None:
            extra_tokens += [ids["fim_sep"], *tok(filename + "\n")]
        else:
            extra_tokens += tok(SNIPPET_SEPARATOR)
        extra_tokens += tok(text)
    if ids.get("fim_sep") is not None:
        extra_tokens += [ids["fim_sep"], *tok("filename\n")]

    prefix_ids, suffix_ids = tok(prefix), tok(suffix)
    n_prefix = min(len(prefix_ids), 3 * (n_batch // 4))
    n_suffix = min(len(suffix_ids), max(0, n_batch // 4 - (2 + len(prompt))))
    n_extra = min(max(0, n_ctx - n_batch - 2 * n_predict), len(extra_tokens))
    head = [ids["fim_pre"], *prefix_ids[len(prefix_ids) - n_prefix:], *prompt]
    tail = [ids["fim_suf"], *suffix_ids[:n_suffix]]
    first, last = (tail, head) if spm else (head, tail)
    bos = [tokenizer.bos_id] if tokenizer.add_bos else []
    return extra_tokens[len(extra_tokens) - n_extra:] + bos + first + last + [ids["fim_mid"]]
