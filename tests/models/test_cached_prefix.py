"""The prefix a prompt with images may reuse from a cached sequence (llama-server's get_common_prefix over image
chunks by id): through an image of the same identity at the same position, never into a different image, never
ending inside one, never through rows of no known image."""

import numpy as np

from pyggml.models.llm.cached_prefix import NO_IDENTITY, prompt_cells, reusable_prefix
from pyggml.models.vision.prompt import image_rows

A, B = -7, -9  # two images' identities


def rows(n: int, identity=None):
    return image_rows(np.zeros((n, 2), np.float32), None, identity)


def test_cells_hold_tokens_and_image_identities():
    prompt, images = [1, 2, 0, 0, 0, 3], [(2, rows(3, A))]
    assert prompt_cells(prompt, images) == [1, 2, A, A, A, 3]
    assert prompt_cells(prompt, [(2, rows(3))]) == [1, 2, NO_IDENTITY, NO_IDENTITY, NO_IDENTITY, 3]


def test_reuse_goes_through_the_same_image_and_stops_at_a_different_one():
    images = [(2, rows(3, A))]
    cells = prompt_cells([1, 2, 0, 0, 0, 3, 4], images)
    assert reusable_prefix(cells, [1, 2, A, A, A, 3, 5], images) == 6  # through the image, to the first new token
    assert reusable_prefix(cells, [1, 2, B, B, B, 3, 4], images) == 2  # another image: only the tokens before it
    assert reusable_prefix(cells, [1, 9, A, A, A, 3, 4], images) == 1  # a token before it differs


def test_reuse_never_ends_inside_an_image():
    images = [(2, rows(3, A))]
    cells = prompt_cells([1, 2, 0, 0, 0, 3], images)
    assert reusable_prefix(cells, [1, 2, A, A], images) == 2  # the cached sequence ends inside it (cut back)
    later = [(2, rows(2, A)), (4, rows(2, B))]
    assert reusable_prefix(prompt_cells([1, 2, 0, 0, 0, 0, 3], later), [1, 2, A, A, B, 8], later) == 4


def test_rows_of_no_known_image_are_never_reused():
    images = [(1, rows(2, A)), (3, rows(2))]
    cells = prompt_cells([1, 0, 0, 0, 0, 2], images)
    assert reusable_prefix(cells, list(cells), images) == 3  # up to the unknown image, though the cells agree
    assert rows(3, A)[:2].identity is None and rows(3, A).copy().identity is None  # a part is not the image
