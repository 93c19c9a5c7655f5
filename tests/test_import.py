"""`import pyggml`: what it brings in, and what it leaves as it was."""

import subprocess
import sys


def _run(code: str, cwd) -> str:
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, check=True).stdout


def test_numba_imports_without_pyyaml_where_no_numba_config_file_is_there(tmp_path):
    """PyYAML is hidden while Numba imports (it reads only a .numba_config.yaml, absent here), then importable."""
    out = _run("import sys, pyggml, numba.core.config as c; print('yaml' in sys.modules, c._HAVE_YAML); "
               "import yaml; print(yaml.safe_load('a: 1'))", tmp_path).split("\n")
    assert out[:2] == ["False False", "{'a': 1}"]


def test_a_numba_config_file_in_the_working_directory_is_still_read(tmp_path):
    (tmp_path / ".numba_config.yaml").write_text("opt: '1'\n")
    out = _run("import pyggml, numba.core.config as c; print(c._HAVE_YAML, int(c.OPT))", tmp_path)
    assert out.split() == ["True", "1"]


def test_pyyaml_imported_first_stays_as_it_was(tmp_path):
    out = _run("import yaml; first = yaml; import sys, pyggml; print(sys.modules['yaml'] is first)", tmp_path)
    assert out.strip() == "True"
