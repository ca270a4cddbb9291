"""Public names that moved to another module: the old module still answers for them, with a warning."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Iterable


def moved_names(old: str, new: str, names: Iterable[str]) -> Callable[[str], object]:
    """A module ``__getattr__`` (PEP 562) for module ``old``: each of ``names`` is ``new``'s, given with a
    DeprecationWarning naming its new home; any other name not in ``old`` is an AttributeError."""
    names = frozenset(names)

    def __getattr__(name: str) -> object:
        if name not in names:
            raise AttributeError(f"module {old!r} has no attribute {name!r}")
        warnings.warn(f"{old}.{name} moved to {new}.{name}", DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new), name)

    return __getattr__
