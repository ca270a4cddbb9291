"""Command-line options declared once, on the fields of a dataclass.

Each field of such a class (``drift.train.TrainConfig``) is made by ``option(default, help, ...)``: its
metadata holds an ``Option`` (the help, the choices, how the command line's text is read and how a value
is checked). From them come a parser's arguments (``add_options``), the check of a config's values
(``first_problem``) and the docs' option table (``markdown_table``); ``declared`` lists them.

The command line's spelling follows from the field: ``--name-with-dashes VALUE``; for a ``switch`` (a
bool) ``--no-name`` where the default is on, ``--name`` where it is off, and both where the default is
None (decided elsewhere, like "on a terminal"). The parser's arguments default to None, which leaves the
field's default in place (``drift.train.config_from`` skips None), so that a command can tell an option
given from one left out.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Callable
from typing import Any

# A value's problem, the end of "--option <problem>" ("must be at least 1, got 0"), or None if it is fine.
Check = Callable[[Any], "str | None"]


@dataclasses.dataclass(frozen=True)
class Option:
    """How one field is given on the command line, shown in the help and the docs, and checked.

    ``help``: what the option does (plain text: ``%`` is escaped for argparse). ``parse``: the
    argparse type reading the command line's text (default: the text). ``choices``: the values it takes
    (also checked on configs built in code). ``check``: a value's problem or None (``at_least``,
    ``positive``, ``non_negative``). ``metavar``: the value's name in the help. ``many``: one value or more
    (a tuple). ``switch``: a bool without a value (the spelling: see the module). ``alone``: the flag may
    come without its value, then meaning True (``--resume`` or ``--resume auto``). ``unset``: what a
    default of None means, for the help and the table. ``name`` and ``default`` are the field's, filled
    in by ``declared``.
    """

    help: str
    parse: Callable[[str], Any] | None = None
    choices: tuple[str, ...] | None = None
    check: Check | None = None
    metavar: str | None = None
    many: bool = False
    switch: bool = False
    alone: bool = False
    unset: str | None = None
    name: str = ""
    default: Any = None

    @property
    def flag(self) -> str:
        """The flag an error message names: ``--weight-decay``, ``--no-prefetch`` for a switch that is on by
        default, ``--progress`` for one that takes both."""
        flag = "--" + self.name.replace("_", "-")
        return flag.replace("--", "--no-", 1) if self.switch and self.default is True else flag

    def shown_default(self) -> str:
        """The default as the help and the table show it: ``unset`` for None, "" for a bool's (the flag
        not given)."""
        if self.default is None:
            return self.unset or ""
        if isinstance(self.default, bool):
            return ""
        if isinstance(self.default, tuple):
            return ",".join(map(str, self.default))
        return str(self.default)

    def usage(self) -> str:
        """The option as the table writes it: ``--width WIDTH``, ``--model {plain,neuralop}``, ``--data
        FILE...``, ``--progress``/``--no-progress``, ``--resume [auto]``."""
        if self.switch:
            return f"`{self.flag}`" + (f"/`--no-{self.flag[2:]}`" if self.default is None else "")
        value = self.metavar or ("{" + ",".join(self.choices) + "}" if self.choices else self.name.upper())
        value = f"[{value}]" if self.alone else f"{value}..." if self.many else value
        return f"`{self.flag} {value}`"

    def help_text(self) -> str:
        """``help`` with the default, as ``--help`` shows it (argparse's ``%`` escaped)."""
        default = self.shown_default()
        text = f"{self.help} (default: {default})" if default else self.help
        return text.replace("%", "%%")

    def problem(self, value: Any) -> str | None:
        """The error message for ``value`` (naming the flag), or None when it is fine. None is fine where
        the default is None."""
        if value is None and self.default is None:
            return None
        if self.choices is not None and value not in self.choices:
            return f"{self.flag} must be one of {', '.join(self.choices)}, got {value!r}"
        problem = self.check(value) if self.check is not None else None
        return None if problem is None else f"{self.flag} {problem}"


def option(default: Any, help: str, **declaration: Any) -> Any:
    """A dataclass field with ``default`` whose metadata holds ``Option(help, **declaration)``."""
    return dataclasses.field(default=default, metadata={"option": Option(help, **declaration)})


def declared(cls: type) -> tuple[Option, ...]:
    """Every field's ``Option`` of dataclass ``cls``, in field order, with its name and default; TypeError
    naming a field that was not made by ``option``."""
    found = []
    for field in dataclasses.fields(cls):
        if "option" not in field.metadata:
            raise TypeError(f"{cls.__name__}.{field.name} is not declared as an option (drift.options.option)")
        found.append(dataclasses.replace(field.metadata["option"], name=field.name, default=field.default))
    return tuple(found)


def first_problem(config: Any) -> str | None:
    """The first declared option of dataclass instance ``config`` whose value does not fit its choices or
    its check: the error message naming it, or None."""
    for declaration in declared(type(config)):
        if (problem := declaration.problem(getattr(config, declaration.name))) is not None:
            return problem
    return None


def add_options(parser: argparse.ArgumentParser, cls: type) -> None:
    """An argument of ``parser`` for each declared option of dataclass ``cls``; each parses to None when
    not given."""
    for declaration in declared(cls):
        arguments = _arguments(declaration)
        parser.add_argument(
            declaration.flag, dest=declaration.name, default=None, help=declaration.help_text(), **arguments
        )


def _arguments(declaration: Option) -> dict[str, Any]:
    """The ``add_argument`` keywords of ``declaration`` besides its flag, destination, default and help."""
    if declaration.switch:
        if declaration.default is None:
            return dict(action=argparse.BooleanOptionalAction)
        return dict(action="store_false" if declaration.default else "store_true")
    arguments: dict[str, Any] = dict(type=declaration.parse, choices=declaration.choices, metavar=declaration.metavar)
    if declaration.many:
        arguments["nargs"] = "+"
    if declaration.alone:
        arguments.update(nargs="?", const=True)
    return {k: v for k, v in arguments.items() if v is not None}


def markdown_table(cls: type) -> str:
    """The declared options of dataclass ``cls`` as a Markdown table: option, default, what it does."""
    rows = ["| Option | Default | What it does |", "| --- | --- | --- |"]
    for declaration in declared(cls):
        cells = (declaration.usage(), declaration.shown_default(), declaration.help)
        rows.append("| " + " | ".join(_cell(cell) for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def _cell(text: str) -> str:
    """``text`` in a table cell: the pipe and the asterisk escaped (``*.hdf5`` is no emphasis). Code spans
    (the option column's) hold neither."""
    return text.replace("|", "\\|").replace("*", "\\*")


def at_least(low: int) -> Check:
    """A check: a number at least ``low``."""

    def check(value: int) -> str | None:
        return None if value >= low else f"must be at least {low}, got {value}"

    return check


def positive(value: float) -> str | None:
    """A check: a positive finite number."""
    return None if 0 < value < math.inf else f"must be positive, got {value}"


def non_negative(value: float) -> str | None:
    """A check: a number at least 0."""
    return None if value >= 0 else f"must be non-negative, got {value}"
