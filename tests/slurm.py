"""A private SLURM cluster of this one machine, for tests: Debian's munged, slurmctld and slurmd.

``Slurm(folder)`` writes its own ``slurm.conf`` and munge key under ``folder`` (never /etc/slurm nor
/etc/munge), starts munged, slurmctld and slurmd there on free ports, waits until the node is idle, and
on exit stops them. ``env`` is the environment the SLURM commands need (``SLURM_CONF``). No cgroups:
processes are tracked by their parentage (``proctrack/linuxproc``). ``require_slurm()`` skips a test
where the daemons are missing or the user is not root, and fails it instead under ``DRIFT_REQUIRE_SLURM=1``
(CI sets it: ``.ci/run`` installs the packages).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import pytest

REQUIRE = "DRIFT_REQUIRE_SLURM"
DAEMONS = ("munged", "mungekey", "slurmctld", "slurmd", "sbatch", "scontrol")
ENDED = ("COMPLETED", "FAILED", "TIMEOUT", "CANCELLED", "NODE_FAIL", "OUT_OF_MEMORY")
KILL_WAIT_S = 30  # SLURM's default grace between SIGTERM and SIGKILL: the window drift's checkpoint must fit


def require_slurm() -> None:
    """Skip the calling test where no SLURM can start here (fail it under ``DRIFT_REQUIRE_SLURM=1``)."""
    missing = [name for name in DAEMONS if shutil.which(name) is None]
    why = f"no {', '.join(missing)} (apt-get install slurmctld slurmd slurm-client munge)" if missing else None
    if why is None and os.geteuid() != 0:
        why = "a private SLURM cluster runs its daemons as root"
    if why is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {why}")
        pytest.skip(why)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Slurm:
    """A one-node SLURM cluster with its state, logs and munge key under ``folder`` (a context manager)."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)
        self.conf = self.folder / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.node = socket.gethostname()
        self._procs: list[subprocess.Popen] = []

    def __enter__(self) -> Slurm:
        try:
            self._start()
        except BaseException:
            self.close()
            raise
        return self

    def _start(self) -> None:
        f = self.folder
        for name in ("state", "spool", "munge"):
            (f / name).mkdir(parents=True, exist_ok=True)
        os.chmod(f / "munge", 0o700)
        key, sock = f / "munge" / "munge.key", f / "munge" / "munge.socket"
        subprocess.run(["mungekey", "--create", "--keyfile", str(key)], check=True, capture_output=True)
        munge = ["munged", "--foreground", "--force", f"--key-file={key}", f"--socket={sock}"]
        munge += [f"--pid-file={f / 'munge' / 'munged.pid'}", f"--log-file={f / 'munge' / 'munged.log'}"]
        munge += [f"--seed-file={f / 'munge' / 'munged.seed'}"]
        self._procs.append(subprocess.Popen(munge, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        memory_mb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20 - 1024
        self.conf.write_text(
            f"""ClusterName=drifttest
SlurmctldHost={self.node}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={sock}
StateSaveLocation={f / "state"}
SlurmdSpoolDir={f / "spool"}
SlurmctldPidFile={f / "slurmctld.pid"}
SlurmdPidFile={f / "slurmd.pid"}
SlurmctldLogFile={f / "slurmctld.log"}
SlurmdLogFile={f / "slurmd.log"}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
ReturnToService=2
MinJobAge=600
KillWait={KILL_WAIT_S}
JobRequeue=1
SchedulerParameters=sched_interval=2
NodeName={self.node} NodeAddr=127.0.0.1 CPUs={os.cpu_count()} RealMemory={memory_mb} State=UNKNOWN
PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""
        )
        # The daemons in the foreground, as children of this process: stopped with it.
        for daemon in (["slurmctld", "-D", "-i"], ["slurmd", "-D"]):
            self._procs.append(
                subprocess.Popen(daemon, env=self.env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            )
        deadline = time.monotonic() + 60
        while "State=IDLE" not in self._scontrol("show", "node", self.node, check=False):
            if time.monotonic() > deadline or any(p.poll() is not None for p in self._procs):
                logs = "".join((f / n).read_text()[-2000:] for n in ("slurmctld.log", "slurmd.log") if (f / n).exists())
                raise RuntimeError(f"the private SLURM did not come up:\n{logs}")
            time.sleep(0.5)

    def _scontrol(self, *args: str, check: bool = True) -> str:
        done = subprocess.run(["scontrol", *args], env=self.env, capture_output=True, text=True, timeout=60)
        if check and done.returncode != 0:
            raise RuntimeError(f"scontrol {' '.join(args)}: {done.stderr.strip()}")
        return done.stdout

    def submit(self, script: Path, *options: str, args: Sequence[str] = ()) -> int:
        """``sbatch [options] script [args]``: the job's id."""
        command = ["sbatch", "--parsable", *options, str(script), *args]
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            raise RuntimeError(f"sbatch: {done.stderr.strip()}")
        return int(done.stdout.strip().split(";")[0])

    def job(self, job: int) -> dict[str, str]:
        """``scontrol show job``'s fields (``JobState``, ``ExitCode``, ``Restarts``, ...)."""
        return dict(re.findall(r"(\w+)=(\S*)", self._scontrol("show", "job", str(job))))

    def wait(self, job: int, timeout_s: float, states: tuple[str, ...] = ENDED) -> dict[str, str]:
        """The job's fields once its state is one of ``states`` (RuntimeError after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while (fields := self.job(job))["JobState"] not in states:
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job} still {fields['JobState']} after {timeout_s:g} s")
            time.sleep(1)
        return fields

    def node_idle(self) -> bool:
        """Whether the cluster's node runs no job and has finished cleaning up after the last one (a job
        started while the node still completes the previous one can fail to launch)."""
        return dict(re.findall(r"(\w+)=(\S*)", self._scontrol("show", "node"))).get("State") == "IDLE"

    def requeue(self, job: int) -> None:
        self._scontrol("requeue", str(job))

    def cancel(self, job: int) -> None:
        """``scancel job``: SIGTERM to every process of the job (the batch shell included), SIGKILL after
        ``KillWait``."""
        subprocess.run(["scancel", str(job)], env=self.env, check=True, timeout=60)

    def warn(self, job: int, name: str = "USR1") -> None:
        """Signal ``job``'s batch shell, as ``sbatch --signal=B:<name>@N`` does before the time limit."""
        subprocess.run(["scancel", f"--signal={name}", "--batch", str(job)], env=self.env, check=True, timeout=60)

    def update(self, job: int, *changes: str) -> None:
        """``scontrol update JobId=job`` with ``changes`` (``StartTime=now``, ``TimeLimit=10``)."""
        self._scontrol("update", f"JobId={job}", *changes)

    def close(self) -> None:
        """Stop the daemons (and the jobs they run) and munged."""
        subprocess.run(["scancel", "--full", "--signal=KILL", "--user=root"], env=self.env, capture_output=True)
        for proc in reversed(self._procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in reversed(self._procs):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)

    def __exit__(self, *_) -> None:
        self.close()
