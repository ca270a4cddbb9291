"""Public names are promises: every module path and public name importable at commit bab9d58
(tests/fixtures/bab9d58/api.txt, written by its make.py) still imports; one that moved since says where,
with a DeprecationWarning."""

import importlib
import importlib.metadata
import warnings
from pathlib import Path

import pytest

import drift

API = Path(__file__).parent / "fixtures" / "bab9d58" / "api.txt"


def _names() -> dict[str, list[str]]:
    modules: dict[str, list[str]] = {}
    for line in API.read_text().splitlines():
        module, name = line.split()
        modules.setdefault(module, []).append(name)
    return modules


@pytest.mark.parametrize(("module", "names"), sorted(_names().items()))
def test_every_former_name_imports(module, names):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        imported = importlib.import_module(module)
        missing = [name for name in names if not hasattr(imported, name)]
    assert not missing, f"{module}: {missing}"
    for warning in caught:  # a moved name points to its new home
        assert issubclass(warning.category, DeprecationWarning) and "moved to" in str(warning.message), warning


def test_the_version_is_the_installed_distributions():
    assert drift.__version__ == importlib.metadata.version("drift-spectral")
