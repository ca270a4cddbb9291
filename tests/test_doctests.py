"""The examples in the docstrings of drift's public API run and show what they say (``>>>`` lines,
checked by doctest), and every public transform, layer, reader and loader has one."""

import doctest
import importlib
import inspect
import pkgutil

import pytest

import drift
import drift.data
import drift.nn

# What a user meets first: each shows a call and what it returns.
SHOWN = [
    drift.TruncatedFFT,
    drift.DistributedFFT,
    drift.nn.SpectralConv,
    drift.nn.FNO,
    drift.nn.parallelize,
    drift.data.Trajectories,
    drift.load_exported,
]


def _modules_with_examples() -> list[str]:
    names = [info.name for info in pkgutil.walk_packages(drift.__path__, "drift.") if info.name != "drift.__main__"]
    return [name for name in names if ">>>" in inspect.getsource(importlib.import_module(name))]


@pytest.mark.parametrize("name", _modules_with_examples())
def test_examples_run(name):
    flags = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
    result = doctest.testmod(importlib.import_module(name), optionflags=flags, verbose=False)
    assert result.attempted > 0 and result.failed == 0, result


@pytest.mark.parametrize("public", SHOWN, ids=lambda obj: obj.__qualname__)
def test_the_public_api_shows_an_example(public):
    assert ">>>" in (public.__doc__ or ""), f"{public.__qualname__} has no example"
