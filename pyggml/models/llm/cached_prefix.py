"""How much of a cached sequence a new prompt may reuse, images included (llama-server's
server_tokens::get_common_prefix). A sequence's cells are listed by what they hold: a token its id, an image's rows
their image's identity, a negative number (pyggml.models.vision.prompt.ImageRows.identity, from the SHA-256 of the
image's bytes). A prompt that holds the same image at the same position after the same tokens reuses the image's
cells as it reuses tokens; a different image stops the reuse where it starts, and so do rows of no known image
(NO_IDENTITY), which match nothing. Reuse never ends inside an image: its rows are decoded together."""

from __future__ import annotations

from typing import Sequence

from pyggml.models.llm.batch import common_prefix

NO_IDENTITY = -1  # the cells of rows whose image is not known


def cell_identity(rows) -> int:
    """The number an image's cells hold in a cached sequence: its rows' identity, or NO_IDENTITY."""
    identity = getattr(rows, "identity", None)
    return NO_IDENTITY if identity is None else identity


def prompt_cells(prompt: Sequence[int], images: Sequence) -> list[int]:
    """What the prompt's cells hold once decoded: its tokens, and its images' identities at their rows' positions."""
    cells = list(prompt)
    for pos, rows in images:
        cells[pos:pos + len(rows)] = [cell_identity(rows)] * len(rows)
    return cells


def reusable_prefix(cells: Sequence[int], cached: Sequence[int], images: Sequence) -> int:
    """The cells at the start of `cached` that a prompt of these cells (prompt_cells) and images may keep: their
    common prefix, cut back to the start of an image it would end inside, or of the first image of no identity."""
    n = common_prefix(cells, cached)
    return min([n] + [pos for pos, rows in images
                      if pos < n and (cell_identity(rows) == NO_IDENTITY or n < pos + len(rows))])
