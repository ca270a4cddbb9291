"""Module paths and names that moved: each keeps working for one minor version, with a DeprecationWarning
that names its new home (docs/STABILITY.md lists them; tests/test_api.py imports every one).

``MODULES`` maps a former module path to the module it became: importing the former path gives that very
module (so patching either patches both). Names that moved out of a module that still exists are answered
by that module's ``__getattr__``, made by ``moved_names``, and recorded in ``NAMES``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType

# Removed in the minor version after the one that moved them.
REMOVED_IN = "0.3.0"

MODULES: dict[str, str] = {
    "drift.cluster": "drift.jobs.cluster",
    "drift.contraction": "drift.truncated._contraction",
    "drift.dct": "drift.fft._dct",
    "drift.launch": "drift.jobs.launch",
    "drift.overlap": "drift.truncated._overlap",
    "drift.predictor": "drift.predict.predictor",
    "drift.reports": "drift.jobs.reports",
    "drift.stages": "drift.truncated._stages",
    "drift.stopping": "drift.jobs.stopping",
    "drift.timeouts": "drift.jobs.timeouts",
}

# (former module, name) -> the module that holds it now, filled as moved_names is called.
NAMES: dict[tuple[str, str], str] = {}
# (former module, name) -> the name it has there, for a name that was renamed as it moved.
RENAMED: dict[tuple[str, str], str] = {}


def _warn(old: str, new: str, stacklevel: int, removed_in: str = REMOVED_IN) -> None:
    message = f"{old} moved to {new}; {old} goes in drift {removed_in}"
    warnings.warn(message, DeprecationWarning, stacklevel=stacklevel + 1)


def deprecated(old: str, new: str) -> None:
    """Warns (DeprecationWarning, at the caller's caller) that ``old`` moved to ``new``: for methods and
    functions kept as deprecated aliases."""
    _warn(old, new, stacklevel=3)


def moved_names(
    old: str, homes: dict[str, Iterable[str]], renamed: dict[str, str] | None = None, removed_in: str = REMOVED_IN
) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562) for module ``old``, whose names listed in ``homes`` (new module
    -> names) now live in those modules, and whose names in ``renamed`` (former name -> ``module.name``)
    moved under a new name: each is given with a DeprecationWarning naming its new home and the release
    that removes it; any other name not in ``old`` is an AttributeError."""
    home = {name: (new, name) for new, names in homes.items() for name in names}
    home |= {name: tuple(new.rsplit(".", 1)) for name, new in (renamed or {}).items()}
    NAMES.update({(old, name): module for name, (module, _) in home.items()})
    RENAMED.update({(old, name): now for name, (_, now) in home.items() if now != name})

    def __getattr__(name: str) -> object:
        if name not in home:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        module, now = home[name]
        _warn(f"{old}.{name}", f"{module}.{now}", stacklevel=2, removed_in=removed_in)
        return getattr(importlib.import_module(module), now)

    return __getattr__


class _FormerPaths(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a former module path (``MODULES``) as the module it became."""

    def find_spec(self, fullname: str, path, target=None) -> importlib.machinery.ModuleSpec | None:
        return importlib.util.spec_from_loader(fullname, self) if fullname in MODULES else None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        # At the import statement: warnings skips the import machinery's frames.
        _warn(spec.name, MODULES[spec.name], stacklevel=2)
        return importlib.import_module(MODULES[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module it became ran when it was imported."""


def install() -> None:
    """Lets the former module paths import (once per process)."""
    if not any(isinstance(finder, _FormerPaths) for finder in sys.meta_path):
        sys.meta_path.append(_FormerPaths())
