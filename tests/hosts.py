"""Several hosts on this machine, for tests of drift across hosts: Linux network namespaces on a switch.

``with Hosts(n) as hosts:`` makes ``n`` hosts, each a network namespace with loopback up and one link
(``hosts.interface(i)``, for ``GLOO_SOCKET_IFNAME``) at ``hosts.address(i)`` (10.77.0.<i + 1>/24). The
links are veth pairs whose other ends are ports of a bridge, the switch, in a namespace of its own: the
machine's own network, routes and firewall are never touched, and every set of hosts is a network of its
own, so the same addresses serve sets made side by side (by other test sessions too).

``hosts.popen(i, argv)`` runs a command on host i (``ip netns exec``); the processes share this machine's
filesystem, users and process ids, only the network is the host's own. ``hosts.cut(i)`` /
``hosts.mend(i)`` partition host i from the others and join it again, ``hosts.kill(i)`` kills what runs
there (a lost host); ``hosts.rate_limit("1gbit")`` limits every link in both directions (a ``tbf`` qdisc;
``None`` lifts it).

Leaving the block kills every process still running on the hosts and deletes the namespaces, which takes
the links, the bridge and the qdiscs with them, also when the block raised. Namespace names hold this
process's id and a count, so concurrent test sessions do not clash.

``skip_unless_hosts()`` skips a test where hosts cannot be made (not root, no ``ip``, ``ip netns add``
refused), naming why; with ``DRIFT_REQUIRE_HOSTS=1`` (as CI sets it) it fails the test instead.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence

import pytest

REQUIRE_ENV = "DRIFT_REQUIRE_HOSTS"
SUBNET = "10.77.0"  # host i is SUBNET.<i + 1>/24
INTERFACE = "eth0"  # each host's link, inside its namespace
_BRIDGE = "br0"  # the switch, inside the switch's namespace
_sets = itertools.count()  # Hosts made by this process


def _ip(*args: str) -> str:
    """Run ``ip *args`` (``tc`` when the first argument is "tc"); its output, or RuntimeError with its error."""
    argv = list(args) if args[0] == "tc" else ["ip", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip()}")
    return done.stdout


class Hosts:
    """``n`` hosts on one switch; use as a context manager (see the module's docstring)."""

    def __init__(self, n: int) -> None:
        if not 1 <= n <= 250:
            raise ValueError(f"hosts: 1 to 250, got {n}")
        self.n = n
        prefix = f"drift-{os.getpid()}-{next(_sets)}"
        self._switch = f"{prefix}-switch"
        self._hosts = [f"{prefix}-host{i}" for i in range(n)]
        self._procs: list[subprocess.Popen] = []
        self._limited = False

    def namespace(self, i: int) -> str:
        """Host i's network namespace (for ``ip -n``, ``ip netns exec``)."""
        self._check(i)
        return self._hosts[i]

    def address(self, i: int) -> str:
        """Host i's address on the switch."""
        self._check(i)
        return f"{SUBNET}.{i + 1}"

    def interface(self, i: int) -> str:
        """The name of host i's link inside its namespace (``GLOO_SOCKET_IFNAME``)."""
        self._check(i)
        return INTERFACE

    def _port(self, i: int) -> str:
        """The switch's port to host i."""
        self._check(i)
        return f"port{i}"

    def _check(self, i: int) -> None:
        if not 0 <= i < self.n:
            raise IndexError(f"host {i} of {self.n}")

    def __enter__(self) -> Hosts:
        try:
            _ip("netns", "add", self._switch)
            _ip("-n", self._switch, "link", "add", _BRIDGE, "type", "bridge")  # STP off: ports forward at once
            _ip("-n", self._switch, "link", "set", _BRIDGE, "up")
            for i, name in enumerate(self._hosts):
                _ip("netns", "add", name)
                _ip("-n", name, "link", "set", "lo", "up")
                # Made inside the host's namespace, the far end moved to the switch's: no name is ever
                # taken in this machine's own namespace.
                veth = ["type", "veth", "peer", "name", self._port(i), "netns", self._switch]
                _ip("-n", name, "link", "add", INTERFACE, *veth)
                _ip("-n", self._switch, "link", "set", self._port(i), "master", _BRIDGE, "up")
                _ip("-n", name, "addr", "add", f"{self.address(i)}/24", "dev", INTERFACE)
                _ip("-n", name, "link", "set", INTERFACE, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None, **kwargs) -> subprocess.Popen:
        """``subprocess.Popen(argv, env=env, **kwargs)`` on host i. Leaving the ``with`` block kills it
        (and whatever it started) if it still runs."""
        self._check(i)
        proc = subprocess.Popen(["ip", "netns", "exec", self._hosts[i], *argv], env=env, **kwargs)
        self._procs.append(proc)
        return proc

    def cut(self, i: int) -> None:
        """Partition host i from the others: the switch drops every packet to and from it. Its link stays
        up and keeps its address, as when a switch between hosts fails: peers hear nothing back, no error,
        until their timeouts."""
        _ip("-n", self._switch, "link", "set", self._port(i), "nomaster")

    def mend(self, i: int) -> None:
        """Join host i to the others again (undo ``cut``)."""
        _ip("-n", self._switch, "link", "set", self._port(i), "master", _BRIDGE)

    def kill(self, i: int) -> None:
        """Host i lost: SIGKILL every process on it at once (its link stays, with no one behind it)."""
        self._kill_all(self.namespace(i))

    def rate_limit(self, rate: str | None = "1gbit", burst: str = "256kb", latency: str = "50ms") -> None:
        """Limit every host's link to ``rate`` (tc units: "100mbit", "1gbit") in each direction, with a token
        bucket (``tc qdisc ... tbf``) of ``burst`` bytes that queues packets up to ``latency``; ``None``
        removes the limit. (The burst must hold a full GSO packet, 64 KiB, or tbf drops such packets.)"""
        if rate is None and not self._limited:
            return
        for i in range(self.n):
            # Host to switch leaves by the host's link, switch to host by the switch's port.
            for namespace, device in ((self._hosts[i], INTERFACE), (self._switch, self._port(i))):
                qdisc = ["tc", "-n", namespace, "qdisc"]
                if rate is None:
                    _ip(*qdisc, "del", "dev", device, "root")  # back to the veth's default, no queue
                else:
                    tbf = ["tbf", "rate", rate, "burst", burst, "latency", latency]
                    _ip(*qdisc, "replace", "dev", device, "root", *tbf)
        self._limited = rate is not None

    def close(self) -> None:
        """Kill every process on the hosts and delete the namespaces (and with them the links, the bridge
        and the qdiscs). Safe to call more than once; RuntimeError if a namespace could not be deleted."""
        names = [*self._hosts, self._switch]
        existing = set(_ip("netns", "list").split())
        for name in names:
            if name in existing:
                self._kill_all(name)
        for proc in self._procs:
            proc.wait(timeout=30)  # reap them (killed above if they still ran)
        self._procs.clear()
        left = []
        for name in names:
            if name in existing:
                try:
                    _ip("netns", "del", name)
                except RuntimeError as error:
                    left.append(str(error))
        if left:
            raise RuntimeError("; ".join(left))

    @staticmethod
    def _kill_all(name: str, timeout_s: float = 30.0) -> None:
        """SIGKILL every process in namespace ``name`` until none is left (one may fork meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while pids := [int(pid) for pid in _ip("netns", "pids", name).split()]:
            if time.monotonic() > deadline:
                raise RuntimeError(f"processes {pids} in network namespace {name} survive SIGKILL")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)


@functools.cache
def unavailable() -> str | None:
    """Why hosts cannot be made here (None if they can): tried once per process."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"no {' or '.join(missing)} (iproute2) on PATH"
    probe = f"drift-{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
        _ip("netns", "del", probe)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as error:
        return f"cannot make a network namespace: {error}"
    return None


def skip_unless_hosts() -> None:
    """Skip the calling test where hosts cannot be made, naming why; fail it instead when
    ``DRIFT_REQUIRE_HOSTS=1``, so that an environment meant to run these tests cannot skip them."""
    why = unavailable()
    if why is None:
        return
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1, but no hosts can be made: {why}", pytrace=False)
    pytest.skip(f"no hosts (network namespaces): {why}")
