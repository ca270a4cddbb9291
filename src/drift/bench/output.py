"""What every ``drift bench`` subcommand writes: a JSON envelope, a compact table, progress bars.

Every JSON file has the keys ``command`` (the subcommand), ``created`` (ISO time), ``argv`` (the
command line), ``machine`` (``runner.machine()``: cores, memory_gb, torch, host), ``config`` (the
options used) and the subcommand's own keys, described in its module docstring.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from drift.bench.runner import machine
from drift.jobs.console import bars_shown


def progress(items: Iterable, desc: str, total: int | None = None, disable: bool = False) -> tqdm:
    """A tqdm bar on stderr, hidden when ``disable`` and where ``drift.jobs.console.bars_shown()`` says (off a
    terminal unless ``--progress``)."""
    hidden = disable or not bars_shown()
    return tqdm(items, desc=desc, total=total, disable=hidden, file=sys.stderr, leave=False, dynamic_ncols=True)


def write_json(out: Path, name: str, command: str, config: dict[str, Any], **content: Any) -> Path:
    """Write ``out/name`` with the common envelope and ``content``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    payload = {
        "command": command,
        "created": datetime.datetime.now().isoformat(timespec="seconds"),
        "argv": sys.argv,
        "machine": machine(),
        "config": config,
        **content,
    }
    path = out / name
    path.write_text(json.dumps(payload, indent=1, default=_jsonable))
    return path


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple | set):
        return list(value)
    raise TypeError(f"{type(value).__name__} is not JSON serialisable")


def fmt(value: Any, digits: int = 3) -> str:
    """A table cell: floats with ``digits`` significant digits, None and NaN as a dash."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        # Whole numbers from 100 up: "4940", not "4.94e+03".
        return f"{value:.0f}" if 100 <= abs(value) < 1e7 else f"{value:.{digits}g}"
    return str(value)


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A compact, column-aligned text table."""
    cells = [list(header)] + [[fmt(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """The same table in Markdown (for the pages under docs/benchmarks/)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def finish(
    out: Path, command: str, config: dict[str, Any], tables: Sequence[tuple[str, list, list]], **content
) -> Path:
    """Print each ``(title, rows, header)`` table, write them to ``out/<command>.md`` and the JSON to
    ``out/<command>.json``; returns the JSON's path."""
    text = []
    for title, rows, header in tables:
        print(title)
        print(table(rows, header))
        text.append(f"{title}\n\n{markdown(rows, header)}")
    path = write_json(out, f"{command}.json", command, config, **content)
    (out / f"{command}.md").write_text("\n\n".join(text) + "\n")
    return path


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    """The options of a parsed command line, for the JSON's ``config``."""
    return {k: v for k, v in vars(args).items() if not callable(v)}
