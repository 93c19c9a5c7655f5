"""Every fixture the tests read is in the project, so no test that needs one can skip for want of it."""

import pytest

from tests.support.fixture_data import DATA, GRAPHS, PLANNING, all_files


@pytest.mark.parametrize("path", all_files(), ids=lambda p: str(p.relative_to(DATA)))
def test_fixture_file_is_present_and_not_empty(path):
    assert path.is_file(), f"fixture {path} is missing"
    assert path.stat().st_size > 0, f"fixture {path} is empty"


def test_every_file_in_the_fixture_folders_is_named():
    """A fixture added to tests/data/ without a name in fixture_data would be read by no test."""
    on_disk = {p for folder in (GRAPHS, PLANNING) for p in folder.iterdir() if p.is_file()}
    assert on_disk == set(all_files())
