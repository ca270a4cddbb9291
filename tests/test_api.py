"""Public names are promises: every module path and public name importable at commit bab9d58
(tests/fixtures/bab9d58/api.txt, written by its make.py) still imports; one that moved since says where,
with a DeprecationWarning."""

import importlib
import importlib.metadata
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from reference import rel_err

import drift
from drift import _moved
from drift.nn import FNO

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


def test_the_former_neuralop_methods_warn_and_convert():
    """``FNO.from_neuralop`` and ``fno.to_neuralop()`` (0.1.0) are ``drift.nn.from_neuralop`` and
    ``drift.nn.to_neuralop``, with a DeprecationWarning naming them."""
    neuralop = pytest.importorskip("neuralop.models")
    torch.manual_seed(0)
    theirs = neuralop.FNO(n_modes=(4, 4), in_channels=2, out_channels=1, hidden_channels=4, n_layers=2)
    with pytest.warns(DeprecationWarning, match=r"FNO.from_neuralop moved to drift.nn.from_neuralop"):
        ours = FNO.from_neuralop(theirs)
    x = torch.randn(1, 2, 8, 8)
    with torch.no_grad():
        assert rel_err(ours(x), theirs(x)) <= 1e-5
    with pytest.warns(DeprecationWarning, match=r"FNO.to_neuralop moved to drift.nn.to_neuralop"):
        back = ours.to_neuralop()
    with torch.no_grad():
        assert rel_err(back(x), theirs(x)) <= 1e-5


def test_docs_list_every_move():
    """docs/STABILITY.md's table has a row for each former module path and name (``drift._moved``)."""
    for module in _names():
        importlib.import_module(module)  # a module's moved names are recorded as it is imported
    table = (Path(__file__).parents[1] / "docs" / "STABILITY.md").read_text()
    rows = list(_moved.MODULES.items()) + [
        (f"{m}.{n}", f"{new}.{_moved.RENAMED.get((m, n), n)}") for (m, n), new in _moved.NAMES.items()
    ]
    missing = [f"| `{old}` | `{new}` |" for old, new in rows if f"| `{old}` | `{new}` |" not in table]
    assert not missing, "docs/STABILITY.md lacks:\n" + "\n".join(missing)


def test_a_former_path_warns_at_the_users_import():
    """The warning names the line that imports the former path, not drift's or importlib's."""
    code = "import drift.overlap\nfrom drift.nn.auto import Machine\n"
    done = subprocess.run(
        [sys.executable, "-W", "default::DeprecationWarning", "-c", code], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if "DeprecationWarning" in line]
    assert lines == [
        "<string>:1: DeprecationWarning: drift.overlap moved to drift.truncated._overlap; "
        "drift.overlap goes in drift 0.3.0",
        "<string>:2: DeprecationWarning: drift.nn.auto.Machine moved to drift.cost.Machine; "
        "drift.nn.auto.Machine goes in drift 0.3.0",
    ], done.stderr
