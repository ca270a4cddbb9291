"""Where a job's ranks run, and which of them still answer.

``Cluster.join()`` (every rank, once the default group exists) starts a small listener thread on each
rank, at the address this host reaches the job's store from, and gathers every rank's node (torchrun's
``GROUP_RANK``, the host's place in the job), address, listener port and versions of drift and torch.
It refuses a job whose hosts run other versions of drift or torch (``ClusterError``), before anything
is trained.

When a collective fails (a peer timed out or went away), ``silent()`` asks every peer's listener for a
reply, all at once, and returns the ranks that gave none within a few seconds: a host cut off by a
partition, stopped or dead. Each side of a partition names the other. ``describe`` puts them in one
line by node: ``node 1 (10.0.0.2: ranks 2, 3)``.

``check_shared(folder)``: every host writes a marker into the run folder and rank 0 checks that it sees
them all; a folder each host has on its own disk is a ``ClusterError`` naming the hosts it cannot see.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

import drift
from drift import comm
from drift.jobs.launch import ranks_text

PROBE_S = 5.0  # how long a peer's listener has to answer a probe
_PING = b"?"


class ClusterError(RuntimeError):
    """The job's hosts cannot work together (versions differ, the run folder is not shared); the message
    names the nodes."""


class PeersLost(ClusterError):
    """A collective failed and these peers stopped answering; the message names their nodes, addresses
    and ranks, and what was running."""


@dataclass(frozen=True)
class Peer:
    """One rank of the job: its node (host) rank, the address it is reached at, its listener's port."""

    rank: int
    node: int
    address: str
    port: int


def node_rank() -> int:
    """This host's place in the job: torchrun's ``GROUP_RANK`` (0 outside torchrun)."""
    return int(os.environ.get("GROUP_RANK", "0"))


def local_address() -> str:
    """The address this host reaches the job's store (``MASTER_ADDR``) from: the interface its route to the
    store leaves by (no packet is sent); 127.0.0.1 without one."""
    master = os.environ.get("MASTER_ADDR")
    if not master or master in ("localhost", "127.0.0.1"):
        return "127.0.0.1"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master, int(os.environ.get("MASTER_PORT", "29500"))))
        return probe.getsockname()[0]
    return socket.gethostbyname(socket.gethostname())


def describe(peers: list[Peer]) -> str:
    """``node 1 (10.0.0.2: ranks 2, 3); node 2 (...)``: the peers, by node."""
    by_node: dict[tuple[int, str], list[int]] = {}
    for peer in peers:
        by_node.setdefault((peer.node, peer.address), []).append(peer.rank)
    parts = []
    for (node, address), ranks in sorted(by_node.items()):
        parts.append(f"node {node} ({address}: {ranks_text(sorted(ranks))})")
    return "; ".join(parts)


def store_answers(timeout_s: float = PROBE_S) -> bool:
    """Whether the job's store (``MASTER_ADDR:MASTER_PORT``) accepts a connection within ``timeout_s``."""
    try:
        address = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]))
        with socket.create_connection(address, timeout=timeout_s):
            return True
    except (KeyError, ValueError, OSError):
        return False


class _Listener:
    """A daemon thread answering each connection with one byte, for as long as this process runs."""

    def __init__(self, address: str) -> None:
        self.socket = socket.create_server((address, 0), backlog=64)
        self.port = self.socket.getsockname()[1]
        threading.Thread(target=self._serve, name="drift-liveness", daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return  # closed
            with conn, contextlib.suppress(OSError):
                conn.sendall(_PING)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.socket.close()


def _answers(peer: Peer, timeout_s: float) -> bool:
    """Whether ``peer``'s listener replies within ``timeout_s``."""
    try:
        with socket.create_connection((peer.address, peer.port), timeout=timeout_s) as conn:
            conn.settimeout(timeout_s)
            return conn.recv(1) == _PING
    except OSError:
        return False


class Cluster:
    """The job's ranks as ``Peer``s (``peers[r]`` is rank r) and this rank's listener."""

    def __init__(self, peers: list[Peer], listener: _Listener | None) -> None:
        self.peers, self._listener = peers, listener

    @classmethod
    def join(cls) -> Cluster:
        """Start this rank's listener and gather every rank's (call on every rank of the default group).
        ClusterError on every rank when the hosts run other versions of drift or torch."""
        address = local_address()
        listener = _Listener(address)
        mine = (node_rank(), address, listener.port, drift.__version__, torch.__version__)
        everyone = comm.all_gather_object(mine)
        peers = [Peer(rank, node, addr, port) for rank, (node, addr, port, *_) in enumerate(everyone)]
        versions: dict[tuple[str, str], list[Peer]] = {}
        for peer, (*_, ours, theirs) in zip(peers, everyone, strict=True):
            versions.setdefault((ours, theirs), []).append(peer)
        if len(versions) > 1:
            listener.close()
            found = "; ".join(f"drift {d}, torch {t} on {describe(p)}" for (d, t), p in sorted(versions.items()))
            raise ClusterError(f"the hosts run different versions: {found}; install the same on every host")
        return cls(peers, listener)

    def silent(self, timeout_s: float = PROBE_S) -> list[Peer]:
        """The other ranks whose listener gives no reply within ``timeout_s`` (asked all at once)."""
        others = [p for p in self.peers if p.rank != comm.rank()]
        if not others:
            return []
        with ThreadPoolExecutor(max_workers=min(64, len(others))) as pool:
            replies = list(pool.map(lambda peer: _answers(peer, timeout_s), others))
        return [peer for peer, answered in zip(others, replies, strict=True) if not answered]

    def check_shared(self, folder: str | Path) -> None:
        """ClusterError on every rank unless ``folder`` is the same folder on every host: the first rank of
        each node writes a marker there, and rank 0 looks for every node's (call on every rank)."""
        folder = Path(folder)
        token = comm.broadcast_object(uuid.uuid4().hex if comm.rank() == 0 else None)
        nodes = {peer.node: peer for peer in reversed(self.peers)}  # each node's lowest rank
        mine = nodes[self.peers[comm.rank()].node].rank == comm.rank()
        marker = folder / f".host-{token}-{self.peers[comm.rank()].node}"
        if mine:
            folder.mkdir(parents=True, exist_ok=True)
            marker.touch()
        comm.barrier()
        unseen = None
        if comm.rank() == 0:
            missing = {node for node in nodes if not (folder / f".host-{token}-{node}").exists()}
            unseen = [peer for peer in self.peers if peer.node in missing]
        unseen = comm.broadcast_object(unseen)
        comm.barrier()  # rank 0 has looked: the markers may go
        if mine:
            marker.unlink(missing_ok=True)
        if unseen:
            raise ClusterError(
                f"--out {folder} is not shared between the hosts: rank 0 ({describe([self.peers[0]])}) does not "
                f"see what {describe(unseen)} wrote there; give every host the same folder (a shared filesystem)"
            )

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
