"""drift train's options are declared once (``drift.options`` on ``TrainConfig``'s fields): the parser, the
checks and the option table of docs/TRAINING.md agree with the declarations, and a field without one fails."""

import argparse
import dataclasses
import re
from pathlib import Path

import pytest

from drift.cli import build_parser
from drift.options import Option, add_options, declared, first_problem, markdown_table, option
from drift.train import ConfigError, TrainConfig, check_config

ROOT = Path(__file__).resolve().parents[1]
TABLE = re.compile(r"<!-- The option table: .*? -->\n(.*?)<!-- The end of the option table -->", re.DOTALL)


def _train_parser() -> argparse.ArgumentParser:
    commands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return commands.choices["train"]


def _agree(action: argparse.Action, declaration: Option) -> None:
    """``action`` is the argument ``declaration`` makes: its flag, value, choices, help and default."""
    name = declaration.name
    assert declaration.flag in action.option_strings, (name, action.option_strings)
    assert action.help == declaration.help_text() and action.default is None, name
    if declaration.switch:
        assert action.nargs == 0 and action.type is None, name
        return
    assert action.type is declaration.parse and action.choices == declaration.choices, name
    assert action.nargs == ("?" if declaration.alone else "+" if declaration.many else None), name
    assert action.metavar == declaration.metavar, name


def test_the_parser_the_checks_and_the_docs_table_agree_with_the_declarations():
    declarations = {d.name: d for d in declared(TrainConfig)}
    assert list(declarations) == [f.name for f in dataclasses.fields(TrainConfig)]
    actions = {a.dest: a for a in _train_parser()._actions if a.dest != "help"}
    assert set(actions) == set(declarations), set(actions) ^ set(declarations)
    for name, declaration in declarations.items():
        assert declaration.default == getattr(TrainConfig(), name)
        _agree(actions[name], declaration)
    text = (ROOT / "docs" / "TRAINING.md").read_text(encoding="utf-8")
    table = TABLE.search(text)
    assert table is not None, "docs/TRAINING.md has no option table between its markers"
    assert table.group(1) == markdown_table(TrainConfig), (
        "docs/TRAINING.md's option table differs from the declarations; it should read:\n" + markdown_table(TrainConfig)
    )
    # The defaults pass their own checks; each check and each set of choices names its option.
    assert first_problem(TrainConfig()) is None
    assert first_problem(TrainConfig(width=0)) == "--width must be at least 1, got 0"
    assert first_problem(TrainConfig(checkpoint_every=float("inf"))) == "--checkpoint-every must be positive, got inf"
    assert first_problem(TrainConfig(weight_decay=-1.0)) == "--weight-decay must be non-negative, got -1.0"
    assert first_problem(TrainConfig(on_nan="ignore")) == "--on-nan must be one of stop, skip-batch, got 'ignore'"
    with pytest.raises(ConfigError, match="--model must be one of plain, neuralop, got 'tfno'"):
        check_config(TrainConfig(model="tfno"), 1)


def test_an_undeclared_field_fails_and_the_spelling_follows_the_declaration():
    @dataclasses.dataclass
    class Undeclared:
        width: int = option(4, "channels")
        depth: int = 2

    with pytest.raises(TypeError, match=r"Undeclared\.depth is not declared as an option"):
        declared(Undeclared)
    with pytest.raises(TypeError, match="depth"):
        add_options(argparse.ArgumentParser(), Undeclared)

    @dataclasses.dataclass
    class Switches:
        prefetch: bool = option(True, "read ahead", switch=True)
        quiet: bool = option(False, "say nothing", switch=True)
        progress: bool | None = option(None, "bars", switch=True, unset="on a terminal")
        data: tuple[str, ...] | None = option(None, "files", many=True, metavar="FILE")

    parser = argparse.ArgumentParser()
    add_options(parser, Switches)
    given = parser.parse_args(["--no-prefetch", "--quiet", "--no-progress", "--data", "a", "b"])
    assert vars(given) == dict(prefetch=False, quiet=True, progress=False, data=["a", "b"])
    assert vars(parser.parse_args([])) == dict(prefetch=None, quiet=None, progress=None, data=None)
    assert markdown_table(Switches).splitlines()[2:] == [
        "| `--no-prefetch` |  | read ahead |",
        "| `--quiet` |  | say nothing |",
        "| `--progress`/`--no-progress` | on a terminal | bars |",
        "| `--data FILE...` |  | files |",
    ]


def test_names_drift_cli_imported_before_the_jobs_moved_still_resolve_with_a_warning():
    import drift.arguments
    import drift.cli
    import drift.jobs.reports

    with pytest.warns(DeprecationWarning, match="drift.cli.reports moved to drift.jobs.reports"):
        assert drift.cli.reports is drift.jobs.reports
    with pytest.warns(DeprecationWarning, match="drift.cli.extents moved to drift.arguments.extents"):
        assert drift.cli.extents is drift.arguments.extents
