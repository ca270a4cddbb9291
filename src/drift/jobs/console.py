"""What drift's commands print while they work: progress bars where someone watches, whole lines where a
log keeps them.

A tqdm bar redraws its line with carriage returns: on a terminal it is one line that moves, in a file (a
batch job's output, a pipe) a line that grows with every redraw, of which a log viewer shows the last.
So the bars of ``drift train``, ``predict``, ``generate`` and ``bench`` are drawn (on stderr) only when
both standard streams are terminals, or when asked; the lines that report progress (one per epoch, the
final metrics) are printed on stdout either way, flushed, and hold no carriage return.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

# "1" or "0": bars drawn or not, whatever the streams are; `drift bench --progress` sets it for its ranks.
PROGRESS_ENV = "DRIFT_PROGRESS"


def bars_shown(asked: bool | None = None) -> bool:
    """Whether to draw progress bars: ``asked`` when given (``--progress``: True, ``--no-progress``:
    False), else ``DRIFT_PROGRESS`` when set, else whether stdout and stderr are both terminals (the bar
    is drawn on stderr between stdout's lines: where either is a log, it would fill it)."""
    if asked is not None:
        return asked
    if (value := os.environ.get(PROGRESS_ENV)) in ("0", "1"):
        return value == "1"
    return all(stream is not None and stream.isatty() for stream in (sys.stdout, sys.stderr))


@contextlib.contextmanager
def progress_asked(asked: bool | None) -> Iterator[None]:
    """Inside the block ``bars_shown()`` answers ``asked``, here and in the processes started here (ranks
    inherit ``DRIFT_PROGRESS``); None leaves it as it is."""
    if asked is None:
        yield
        return
    before = os.environ.get(PROGRESS_ENV)
    os.environ[PROGRESS_ENV] = "1" if asked else "0"
    try:
        yield
    finally:
        if before is None:
            del os.environ[PROGRESS_ENV]
        else:
            os.environ[PROGRESS_ENV] = before
