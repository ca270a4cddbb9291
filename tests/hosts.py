"""Several "hosts" on this machine, for multi-host tests: network namespaces joined by a bridge.

``Hosts(n)`` makes namespaces ``drift-<pid>-<i>``, each with loopback and one interface (``eth0``) on a
bridge in the root namespace, at 10.<a>.<b>.<i + 1>/24 (a subnet picked from this process's id, inside
the namespaces only), and removes them all on exit. ``popen(i, argv)`` runs a command in host i;
``cut(i)``/``mend(i)`` take host i's link down and up (a partition). Making namespaces needs root and
``ip``: ``require_hosts()`` skips a test where that is missing, and fails it instead when
``DRIFT_REQUIRE_HOSTS=1`` (CI sets it, so these tests cannot pass by skipping).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence

import pytest

REQUIRE = "DRIFT_REQUIRE_HOSTS"


def _ip(*args: str, namespace: str | None = None) -> None:
    prefix = ["ip", "netns", "exec", namespace] if namespace else []
    subprocess.run([*prefix, "ip", *args], check=True, capture_output=True, text=True, timeout=30)


def _why_not() -> str | None:
    """Why this machine cannot make hosts (None when it can)."""
    if os.geteuid() != 0:
        return "multi-host tests make network namespaces, which needs root"
    if shutil.which("ip") is None:
        return "multi-host tests need iproute2's ip"
    probe = f"drift-probe-{os.getpid()}"
    try:
        _ip("netns", "add", probe)
    except (subprocess.CalledProcessError, OSError) as exc:
        return f"ip netns add failed: {getattr(exc, 'stderr', exc)}"
    _ip("netns", "del", probe)
    return None


def require_hosts() -> None:
    """Skip the calling test where namespaces cannot be made (fail it under ``DRIFT_REQUIRE_HOSTS=1``)."""
    why = _why_not()
    if why is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"{REQUIRE}=1 but {why}")
        pytest.skip(why)


class Hosts:
    """``n`` hosts as network namespaces on one bridge (a context manager)."""

    def __init__(self, n: int) -> None:
        self.n, self.tag = n, f"d{os.getpid() % 100_000}"
        self.subnet = f"10.{100 + os.getpid() % 100}.{os.getpid() // 100 % 250}"
        self.bridge = f"{self.tag}br"

    def namespace(self, i: int) -> str:
        return f"drift-{self.tag}-{i}"

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 1}"

    def _veth(self, i: int) -> str:
        return f"{self.tag}v{i}"

    interface = "eth0"  # every host's link, inside its namespace (for GLOO_SOCKET_IFNAME)

    def __enter__(self) -> Hosts:
        try:
            _ip("link", "add", self.bridge, "type", "bridge")
            _ip("link", "set", self.bridge, "up")
            for i in range(self.n):
                ns = self.namespace(i)
                _ip("netns", "add", ns)
                _ip("link", "add", self._veth(i), "type", "veth", "peer", "name", self.interface, "netns", ns)
                _ip("link", "set", self._veth(i), "master", self.bridge)
                _ip("link", "set", self._veth(i), "up")
                _ip("addr", "add", f"{self.address(i)}/24", "dev", self.interface, namespace=ns)
                _ip("link", "set", self.interface, "up", namespace=ns)
                _ip("link", "set", "lo", "up", namespace=ns)
        except BaseException:
            self.close()
            raise
        return self

    def popen(self, i: int, argv: Sequence[str], env: dict | None = None, **options) -> subprocess.Popen:
        """``argv`` in host i's namespace, with ``env`` and ``GLOO_SOCKET_IFNAME`` set to its link."""
        env = {**(env or os.environ), "GLOO_SOCKET_IFNAME": self.interface}
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(i), *argv], env=env, **options)

    def cut(self, i: int) -> None:
        """Take host i's link down: the others no longer reach it, nor it them (nothing is refused: silence)."""
        _ip("link", "set", self._veth(i), "down")

    def mend(self, i: int) -> None:
        _ip("link", "set", self._veth(i), "up")

    def close(self) -> None:
        """Kill what still runs in the namespaces and remove them, the links and the bridge."""
        for i in range(self.n):
            ns = self.namespace(i)
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
            subprocess.run(["ip", "link", "del", self._veth(i)], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)

    def __exit__(self, *_) -> None:
        self.close()
