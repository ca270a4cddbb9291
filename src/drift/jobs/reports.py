"""How a failed ``drift`` job reports: one error line per host, every failed rank's traceback in
``<out>/failure.log``, and the torchrun agent ended where its host lost the job."""

from __future__ import annotations

import contextlib
import hashlib
import os
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from drift.jobs.launch import RankError

FAILURE_LOG = "failure.log"  # every failed rank's traceback, in the run folder


def first_on_host(message: str) -> bool:
    """Under torchrun, whether this rank is the first of its host to report ``message``: the ranks check
    the same options and data and meet the same failure, which their host reports once. A marker file
    per message, job, host and restart (torchrun's environment) in the host's temporary folder decides."""
    keys = ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")
    key = hashlib.sha256("\0".join([*(os.environ.get(k, "") for k in keys), message]).encode()).hexdigest()[:20]
    try:
        os.close(os.open(Path(tempfile.gettempdir()) / f"drift-reported-{key}", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True


def raised(report: str, kinds: tuple[type, ...]) -> bool:
    """Whether a rank's report (a traceback) ends in one of ``kinds``."""
    last = report.rstrip().rsplit("\n", 1)[-1]
    return last.startswith(tuple(f"{kind.__module__}.{kind.__qualname__}:" for kind in kinds))


def forget_failure(out: str) -> None:
    """Remove the ``failure.log`` of an earlier job in ``out`` (unless a running one holds the folder): the
    one there then is this job's."""
    from drift.checkpoint import FolderInUse, check_unlocked

    with contextlib.suppress(OSError, FolderInUse):
        check_unlocked(out)
        os.remove(os.path.join(out, FAILURE_LOG))


def rank_failure(exc: RankError, out: str, expected: tuple[type, ...]) -> str:
    """The error line for a ``RankError`` of ``drift train --nproc N``. A failure other than one of drift's
    own ``expected`` errors (one line each) writes every failed rank's report to ``<out>/failure.log``,
    named in the line, and prints the root cause's (the first failed rank's) traceback once; when the log
    cannot be written the line says why."""
    if exc.first is None or raised(exc.reports[exc.first], expected):
        return str(exc)
    reports = "".join(f"--- rank {rank} ---\n{report.rstrip()}\n" for rank, report in exc.reports.items())
    if (problem := write_log(out, f"{exc}\n{reports}", "w")) is not None:
        return f"{exc} ({problem})"
    print(f"rank {exc.first} (the first to fail):\n{exc.reports[exc.first].rstrip()}", file=sys.stderr)
    return f"{exc} (every rank's report: {os.path.join(out, FAILURE_LOG)})"


def write_log(out: str, text: str, mode: str) -> str | None:
    """Write (``"w"``) or append (``"a"``) ``text`` to ``<out>/failure.log``: None, or why it could not."""
    try:
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, FAILURE_LOG), mode) as f:
            f.write(text)
    except OSError as error:
        return f"no {FAILURE_LOG}: {error.strerror or error}"
    return None


def own_failure(out: str, rank: int, attempt: int) -> str:
    """The error line of torchrun's rank ``rank`` failing inside ``except`` with an error other than one of
    drift's own: its traceback is printed once here and appended to ``<out>/failure.log`` (every failing
    rank's, each attempt's), named in the line. Above torchrun's own summary of the failed job."""
    report = traceback.format_exc()
    kind, _, message = report.rstrip().rsplit("\n", 1)[-1].partition(": ")
    line = f"rank {rank} failed: {kind}: {' '.join(message.split())[:500]}"
    print(report.rstrip(), file=sys.stderr)
    # Appended: the ranks start apart, so none can tell an earlier job's log from one a peer just wrote.
    job = os.environ.get("TORCHELASTIC_RUN_ID", "?")
    header = f"--- rank {rank}, attempt {attempt}, job {job}, {time.strftime('%Y-%m-%d %H:%M:%S')} ---"
    if (problem := write_log(out, f"{header}\n{report.rstrip()}\n", "a")) is not None:
        return f"{line} ({problem})"
    return f"{line} (every failed rank's report: {os.path.join(out, FAILURE_LOG)})"


def stranded() -> bool:
    """Whether this torchrun rank's host has lost the job's store while torchrun has restarts left: its
    agent would try to rejoin and wait for the store without end (in a ``recv`` that no signal ends)."""
    from drift.jobs.cluster import store_answers

    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))
    return restarts > int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) and not store_answers()


def stop_agent(grace_s: float = 5.0) -> None:
    """End this rank's torchrun agent: SIGTERM, then SIGKILL after ``grace_s`` if it is still there (its main
    thread may be blocked where Python cannot run a handler)."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the agent passes its SIGTERM on to us
    agent = os.getppid()
    os.kill(agent, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while os.getppid() == agent and time.monotonic() < deadline:
        time.sleep(0.1)
    if os.getppid() == agent:
        os.kill(agent, signal.SIGKILL)
