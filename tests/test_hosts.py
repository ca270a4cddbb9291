"""drift train across hosts (issue 30): one torchrun agent per "host" (a network namespace, ``hosts.py``).
Static and c10d rendezvous train as one host with as many ranks, a data mesh dim spans hosts, a
checkpoint of 2 hosts x 2 ranks resumes on 1 rank and on 3; a partition ends a fixed-size job on every
host within the phase's bound + 30 s with one line naming the other side, while an elastic job goes on
at the store's side; a lost host's job goes on at the survivors' rank count; a run folder that is not
shared is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import hosts as hosts_module
import pytest
from hosts import Hosts, skip_unless_hosts
from runs import assert_same_metrics, checkpoint_names, metric_rows, tiny_data, train_argv

from drift.checkpoint import usable_checkpoint
from drift.cli import main
from drift.jobs.timeouts import FLOOR_S
from drift.train import META_KEYS

ENV = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread a rank everywhere: every run sums in one order
PORT = 29400 + os.getpid() % 500
AGENT_S = 300  # a generous bound on one agent's run: a hang fails the test
# The elastic tests bound their collectives with --collective-timeout (the fixed-size partition test keeps
# the floor): what they test is the side that goes on, not the bound.
ELASTIC_TIMEOUT_S = 20


@pytest.fixture(autouse=True)
def _hosts_available():
    skip_unless_hosts()


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tiny_data(tmp_path_factory.mktemp("hosts") / "cfd.hdf5")


def _reference(out: Path, data: str, *args: str) -> list[dict]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("OMP_NUM_THREADS", "1")
        assert main(train_argv(data, out, *args)) == 0
    return metric_rows(out)


@pytest.fixture(scope="module")
def six(tmp_path_factory, data):
    """``drift train --nproc 4`` on one host, 6 epochs: the rows the elastic jobs end with."""
    return _reference(tmp_path_factory.mktemp("six") / "run", data, "--epochs", "6", "--nproc", "4")


@pytest.fixture(scope="module")
def four(tmp_path_factory, data):
    """``drift train --nproc 4`` on one host, 3 epochs: the rows every 4-rank layout must give."""
    return _reference(tmp_path_factory.mktemp("four") / "run", data, "--epochs", "3", "--nproc", "4")


def _torchrun(hosts: Hosts, i: int, nnodes: str, rendezvous: str, train: list[str], *extra: str) -> list[str]:
    """Host i's torchrun command: ``static`` (``--master-addr`` host 0) or ``c10d`` rendezvous (on host 0,
    which hosts the store: ``is_host=1`` there, ``--local-addr`` on each) of 2 ranks a host."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", nnodes, "--nproc-per-node", "2", *extra]
    if rendezvous == "static":
        cmd += ["--node-rank", str(i), "--master-addr", hosts.address(0), "--master-port", str(PORT)]
    else:
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"{hosts.address(0)}:{PORT}", "--rdzv-id", "drift"]
        # An elastic job's rendezvous waits last_call_timeout (30 s) for more hosts once it has its minimum.
        conf = [*(["is_host=1"] if i == 0 else []), *(["last_call_timeout=5"] if ":" in nnodes else [])]
        cmd += ["--local-addr", hosts.address(i), *(["--rdzv-conf", ",".join(conf)] if conf else [])]
    return [*cmd, "-m", "drift", *train]


def _start(hosts: Hosts, commands: list[list[str]]) -> list[subprocess.Popen]:
    """Command i on host i, its ranks talking over the host's link."""
    return [
        hosts.popen(
            i,
            cmd,
            env={**ENV, "GLOO_SOCKET_IFNAME": hosts.interface(i)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i, cmd in enumerate(commands)
    ]


def _finish(agents: list[subprocess.Popen], timeout_s: float = AGENT_S) -> list[tuple[int, str]]:
    """Each agent's exit code and standard error."""
    return [(agent.wait(timeout=timeout_s), agent.communicate()[1]) for agent in agents]


def _on_two_hosts(data: str, out: Path, rendezvous: str, *args: str) -> None:
    with Hosts(2) as hosts:
        train = train_argv(data, out, *args)
        results = _finish(_start(hosts, [_torchrun(hosts, i, "2", rendezvous, train) for i in range(2)]))
    for code, err in results:
        assert code == 0, err


@pytest.mark.parametrize("rendezvous", ["static", "c10d"])
def test_two_hosts_train_as_one_host_with_as_many_ranks(data, four, tmp_path, rendezvous):
    out = tmp_path / "run"
    _on_two_hosts(data, out, rendezvous, "--epochs", "3")
    assert_same_metrics(metric_rows(out), four)


def test_a_data_mesh_dim_spans_the_hosts(data, tmp_path):
    out = tmp_path / "run"
    _on_two_hosts(data, out, "static", "--epochs", "2", "--data-parallel", "2")
    reference = _reference(tmp_path / "one", data, "--epochs", "2", "--nproc", "4", "--data-parallel", "2")
    assert_same_metrics(metric_rows(out), reference)


def test_a_reduction_within_then_across_hosts_with_overlap(data, four, tmp_path):
    """``--reduction hosts`` (2 x 2: within each host, then across) and ``--overlap 2`` train as one host
    does, to the float32 round-off of sums in another order."""
    out = tmp_path / "run"
    _on_two_hosts(data, out, "static", "--epochs", "2", "--reduction", "hosts", "--overlap", "2")
    rows = metric_rows(out)
    assert_same_metrics(rows, four[:2], rtol=1e-5)


def test_a_checkpoint_of_two_hosts_resumes_on_one_rank_and_on_three(data, four, tmp_path):
    two = tmp_path / "two"
    _on_two_hosts(data, two, "static", "--epochs", "2")
    assert_same_metrics(metric_rows(two), four[:2])
    for nproc in ("1", "3"):
        out = tmp_path / f"on-{nproc}"
        shutil.copytree(two, out)
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("OMP_NUM_THREADS", "1")
            assert main(train_argv(data, out, "--epochs", "3", "--nproc", nproc, "--resume")) == 0
        rows = metric_rows(out)
        assert_same_metrics(rows[:2], four[:2])
        assert_same_metrics(rows[2:], four[2:], rtol=1e-5)  # another rank count: its reductions' round-off


def _wait_for(path: Path, agents: list[subprocess.Popen], timeout_s: float = AGENT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert time.monotonic() < deadline and all(a.poll() is None for a in agents), f"no {path}"
        time.sleep(0.05)


def _lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("drift train: error:")]


def test_a_partition_ends_a_fixed_size_job_on_every_host(data, tmp_path):
    out = tmp_path / "run"
    with Hosts(2) as hosts:
        train = train_argv(data, out, "--epochs", "100")
        agents = _start(hosts, [_torchrun(hosts, i, "2", "static", train) for i in range(2)])
        _wait_for(out / "checkpoints" / "epoch-0002", agents)  # every phase timed: bounds of FLOOR_S
        hosts.cut(1)
        cut = time.monotonic()
        ended = []
        for agent in agents:
            agent.wait(timeout=AGENT_S)
            ended.append(time.monotonic() - cut)
        (code0, err0), (code1, err1) = _finish(agents)
    assert max(ended) <= FLOOR_S + 30, ended
    assert code0 != 0 and code1 != 0
    for err, other in (
        (err0, f"node 1 ({hosts.address(1)}: ranks 2, 3)"),
        (err1, f"node 0 ({hosts.address(0)}: ranks 0, 1)"),
    ):
        lines = _lines(err)
        assert len(lines) == 1 and f"{other} stopped answering during " in lines[0], err
        assert f"collective timeout {FLOOR_S:g} s); the newest checkpoint: {out / 'checkpoints'}" in lines[0]
    # The newest complete checkpoint loads: the job can be resumed.
    assert usable_checkpoint(out / "checkpoints", META_KEYS) == Path(lines[0].rsplit(": ", 1)[1])


def test_an_elastic_job_goes_on_at_the_stores_side_of_a_partition(data, six, tmp_path):
    out = tmp_path / "run"
    with Hosts(2) as hosts:
        train = train_argv(data, out, "--epochs", "6", "--collective-timeout", str(ELASTIC_TIMEOUT_S))
        elastic = ("--max-restarts", "1")
        agents = _start(hosts, [_torchrun(hosts, i, "1:2", "c10d", train, *elastic) for i in range(2)])
        _wait_for(out / "checkpoints" / "epoch-0002", agents)
        hosts.cut(1)
        cut = time.monotonic()
        agents[1].wait(timeout=AGENT_S)
        stranded_s = time.monotonic() - cut
        (code0, err0), (code1, err1) = _finish(agents)
    assert code0 == 0, err0
    assert stranded_s <= ELASTIC_TIMEOUT_S + 30, stranded_s
    lines = _lines(err1)
    assert len(lines) == 1 and f"node 0 ({hosts.address(0)}: ranks 0, 1) stopped answering" in lines[0], err1
    assert "is out of reach too: this host leaves the job" in lines[0]
    # The store's side resumed at its own 2 ranks from the newest checkpoint and finished.
    rows = metric_rows(out)
    assert [r["epoch"] for r in rows] == list(range(1, 7))
    assert_same_metrics(rows, six, rtol=1e-5)


def test_a_lost_host_leaves_an_elastic_job_to_the_survivors(data, six, tmp_path):
    out = tmp_path / "run"
    with Hosts(2) as hosts:
        train = train_argv(data, out, "--epochs", "6", "--collective-timeout", str(ELASTIC_TIMEOUT_S))
        agents = _start(hosts, [_torchrun(hosts, i, "1:2", "c10d", train, "--max-restarts", "1") for i in range(2)])
        _wait_for(out / "checkpoints" / "epoch-0002", agents)
        for pid in subprocess.run(
            ["ip", "netns", "pids", hosts.namespace(1)], capture_output=True, text=True
        ).stdout.split():
            subprocess.run(["kill", "-9", pid], capture_output=True)
        (code0, err0), _ = _finish(agents)
    assert code0 == 0, err0
    assert_same_metrics(metric_rows(out), six, rtol=1e-5)
    assert checkpoint_names(out)[1] == "epoch-0006"


def test_a_run_folder_that_is_not_shared_is_refused(data, tmp_path):
    out = tmp_path / "shared" / "run"
    out.parent.mkdir()
    with Hosts(2) as hosts:
        train = train_argv(data, out, "--epochs", "2")
        commands = [_torchrun(hosts, i, "2", "static", train) for i in range(2)]
        # Host 1 sees its own, empty folder there (a tmpfs in its mount namespace): another disk.
        private = f'mount -t tmpfs tmpfs {out.parent} && exec "$@"'
        commands[1] = ["sh", "-c", private, "sh", *commands[1]]
        results = _finish(_start(hosts, commands))
    assert all(code != 0 for code, _ in results)
    lines = _lines(results[0][1])
    assert len(lines) == 1 and f"--out {out} is not shared between the hosts" in lines[0], results[0][1]
    assert f"node 1 ({hosts.address(1)}: ranks 2, 3)" in lines[0]
    assert not (out / "checkpoints").exists()


def _listen(hosts: Hosts, j: int) -> tuple[subprocess.Popen, int]:
    """A receiver on host j (every address, a free port): it reads one connection to its end, then prints
    the bytes and seconds. Returns it and its port."""
    script = (
        "import socket, sys, time\n"
        "server = socket.create_server(('0.0.0.0', 0))\n"
        "print(server.getsockname()[1], flush=True)\n"
        "conn, _ = server.accept()\n"
        "began, count = time.monotonic(), 0\n"
        "while block := conn.recv(1 << 16):\n"
        "    count += len(block)\n"
        "print(count, time.monotonic() - began, flush=True)\n"
    )
    receiver = hosts.popen(j, [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    return receiver, int(receiver.stdout.readline())


def _send(hosts: Hosts, i: int, address: str, port: int, count: int) -> bool:
    """Whether host i connects to ``address:port`` within 1 s and sends ``count`` zero bytes."""
    script = (
        "import socket, sys\n"
        "with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=1) as conn:\n"
        "    conn.sendall(bytes(int(sys.argv[3])))\n"
    )
    sender = hosts.popen(i, [sys.executable, "-c", script, address, str(port), str(count)], stderr=subprocess.DEVNULL)
    return sender.wait(timeout=60) == 0


def _received(receiver: subprocess.Popen) -> tuple[int, float]:
    """A receiver's bytes and seconds."""
    count, seconds = receiver.communicate(timeout=60)[0].split()
    return int(count), float(seconds)


def test_hosts_reach_each_other_until_cut_and_are_rate_limited_then_removed():
    skip_unless_hosts()
    with Hosts(3) as hosts:
        names = [hosts.namespace(i) for i in range(3)]
        assert len({hosts.address(i) for i in range(3)}) == 3 and hosts.interface(0) == "eth0"
        for i in range(3):
            receiver, port = _listen(hosts, i)
            assert _send(hosts, i, "127.0.0.1", port, 10)  # loopback is up
            assert _received(receiver)[0] == 10
        receiver, port = _listen(hosts, 0)
        assert _send(hosts, 1, hosts.address(0), port, 1 << 20)
        count, seconds = _received(receiver)
        assert count == 1 << 20 and seconds < 0.5, seconds
        # 2 MiB at 16 Mbit/s: 0.92 s for what the 256 kB burst does not cover, in either direction.
        hosts.rate_limit("16mbit")
        for i, j in ((1, 0), (0, 1)):
            receiver, port = _listen(hosts, j)
            assert _send(hosts, i, hosts.address(j), port, 2 << 20)
            count, seconds = _received(receiver)
            assert count == 2 << 20 and seconds > 0.7, seconds
        hosts.rate_limit(None)
        # Host 0 cut off: no connection either way, while hosts 1 and 2 still talk.
        hosts.cut(0)
        receiver, port = _listen(hosts, 0)
        other, other_port = _listen(hosts, 2)
        assert not _send(hosts, 1, hosts.address(0), port, 10)
        assert not _send(hosts, 0, hosts.address(2), other_port, 10)
        third, third_port = _listen(hosts, 1)
        assert _send(hosts, 2, hosts.address(1), third_port, 10) and _received(third)[0] == 10
        hosts.mend(0)
        assert _send(hosts, 1, hosts.address(0), port, 10) and _received(receiver)[0] == 10
        assert _send(hosts, 0, hosts.address(2), other_port, 10) and _received(other)[0] == 10
        sleeper = hosts.popen(1, ["sleep", "600"])
    # Gone on leaving: the processes left on the hosts, the namespaces with their links and bridge.
    assert sleeper.returncode == -9
    assert not set(names) & set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())


def test_hosts_that_cannot_be_made_skip_or_fail_when_required(monkeypatch):
    monkeypatch.setattr(hosts_module, "unavailable", lambda: "no ip")
    monkeypatch.delenv(hosts_module.REQUIRE_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="no hosts \\(network namespaces\\): no ip"):
        skip_unless_hosts()
    monkeypatch.setenv(hosts_module.REQUIRE_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="DRIFT_REQUIRE_HOSTS=1, but no hosts can be made: no ip"):
        skip_unless_hosts()
