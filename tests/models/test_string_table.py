"""StringTable: a vocabulary as one block of UTF-8 bytes, read as a sequence of str and looked up by hash."""

import pytest

from pyggml.models.gguf.string_table import StringTable

WORDS = ["<s>", "▁héllo", "日本", "", "a", "ab", "▁", "<0x0A>"]


def test_reads_back_every_string_as_a_sequence():
    t = StringTable.from_strings(WORDS)
    assert len(t) == len(WORDS) and list(t) == WORDS and t.tolist() == WORDS
    assert t[1] == "▁héllo" and t[-1] == "<0x0A>" and t[2:4] == ["日本", ""]
    assert t == WORDS and t == tuple(WORDS) and t != WORDS[:-1]
    assert t.lengths().tolist() == [len(w.encode()) for w in WORDS]
    with pytest.raises(IndexError):
        t[len(WORDS)]


def test_ids_answer_as_a_dict_would():
    t = StringTable.from_strings(WORDS)
    expected = {w: i for i, w in enumerate(WORDS)}
    ids = t.ids
    assert all(ids[w] == i for w, i in expected.items())
    assert ids.get("missing") is None and ids.get("missing", -1) == -1 and ids.get(3) is None
    assert "日本" in ids and "日" not in ids and "a" in t and 5 not in t
    with pytest.raises(KeyError):
        ids["abc"]
    assert t.first_repeat() is None


def test_a_repeated_string_is_found_with_its_first_index():
    t = StringTable.from_strings(["x", "y", "z", "y", "x"])
    assert t.first_repeat() in {(3, 1), (4, 0)}
    assert t.index_of("y") == 1 and t.index_of("x") == 0


def test_a_large_table_finds_every_string():
    words = [f"tok{i}" for i in range(20000)]
    t = StringTable.from_strings(words)
    assert all(t.index_of(words[i]) == i for i in range(0, len(words), 97))
    assert t.index_of("tok20000") is None


def test_strings_hash_by_fnv1a_of_their_utf8_bytes():
    """The index's hash is 64-bit FNV-1a over UTF-8 (the published test vectors), computed alike for the table
    and for a looked-up string, so non-ASCII strings are found too; strings sharing a hash are told apart."""
    from pyggml.models.gguf import string_table

    assert string_table.fnv1a(b"", 0, 0) == 0xCBF29CE484222325
    assert string_table.fnv1a(b"a", 0, 1) == 0xAF63DC4C8601EC8C
    assert string_table.fnv1a(b"foobar", 0, 6) == 0x85944171F73967E8
    table = StringTable.from_strings(["ä", "日本", "▁the", "a"])
    assert [table.ids[s] for s in ("a", "ä", "▁the", "日本")] == [3, 0, 2, 1] and "b" not in table


def test_strings_of_one_hash_are_told_apart(monkeypatch):
    from pyggml.models.gguf import string_table

    monkeypatch.setattr(string_table, "fnv1a_hashes", lambda blob, offsets, out: out.fill(7))
    monkeypatch.setattr(string_table, "first_with_hash", lambda data, hashes: 0)
    table = StringTable.from_strings(["x", "y", "z", "y"])
    assert table.ids["z"] == 2 and table.ids["y"] == 1 and table.first_repeat() == (3, 1) and "w" not in table
