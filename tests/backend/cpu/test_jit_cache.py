"""The compiled kernels' cache: cold detection, and emptied when the package's sources change."""

from pyggml.backend.cpu.jit import compile_cache


class _Dispatcher:
    """Stands for a Numba dispatcher: only the cache paths are read."""

    def __init__(self, directory, index):
        self._cache = type("Cache", (), {"_cache_path": str(directory)})()
        self._cache._cache_file = type("File", (), {"_index_path": str(directory / index)})()


def test_a_missing_index_means_cold(tmp_path):
    (tmp_path / "warm.nbi").write_bytes(b"")
    assert not compile_cache.is_cold([_Dispatcher(tmp_path, "warm.nbi")])
    assert compile_cache.is_cold([_Dispatcher(tmp_path, "warm.nbi"), _Dispatcher(tmp_path, "cold.nbi")])


def test_cache_files_go_when_the_fingerprint_differs(tmp_path):
    kernel = _Dispatcher(tmp_path, "k.nbi")
    (tmp_path / "k.nbi").write_bytes(b"index")
    (tmp_path / "k.1.nbc").write_bytes(b"code")
    compile_cache.drop_stale(kernel)            # no fingerprint yet: emptied, fingerprint written
    assert not list(tmp_path.glob("*.nb?")) and (tmp_path / compile_cache.FINGERPRINT).exists()
    (tmp_path / "k.nbi").write_bytes(b"index")
    compile_cache.drop_stale(kernel)            # same sources: kept
    assert (tmp_path / "k.nbi").exists()
    (tmp_path / compile_cache.FINGERPRINT).write_text("sources of another version")
    compile_cache.drop_stale(kernel)
    assert not (tmp_path / "k.nbi").exists()
