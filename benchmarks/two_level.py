"""One FNO block per method on 2 hosts x 2 ranks joined by a rate-limited link: time and bytes on the wire.

The hosts are network namespaces on one switch (tests/hosts.py; needs root and iproute2), each running a
torchrun agent of 2 ranks (static rendezvous); every host's link is limited to ``--rate`` in both
directions with a ``tbf`` qdisc (netem is not available), and the same runs again on the unlimited link.
In each setting one launch times every method's block forward (``drift.bench.blocks.block_worker``:
the slowest rank's time between barriers, median of ``--repeats`` after a warm-up), the methods
interleaved in ``--rounds`` rounds, and counts the bytes that crossed the link per forward (the kernel's
counters of each host's interface, ``/sys/class/net/eth0/statistics``, over the warm-up and timed passes,
barriers included), beside rank 0's payload as drift's comm log records it.

    sudo python benchmarks/two_level.py [--shape 64x64x32x30] [--rate 1gbit] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
METHODS = ("drift", "dfno", "dfno-pruned")


def _wire_bytes() -> int:
    """Bytes this host's link has sent and received so far (its namespace's view of ``eth0``)."""
    stats = Path("/sys/class/net/eth0/statistics")
    return sum(int((stats / name).read_text()) for name in ("tx_bytes", "rx_bytes"))


def worker(args: argparse.Namespace) -> None:
    """On every rank under torchrun: the methods' block forwards in rounds; rank 0 writes the results."""
    import torch

    from drift import comm
    from drift.bench import blocks
    from drift.launch import process_group

    torch.set_num_threads(1)
    shape = tuple(int(n) for n in args.shape.split("x"))
    first_on_host = os.environ.get("LOCAL_RANK") == "0"
    rows: dict[str, list] = {m: [] for m in args.methods}
    with process_group("cpu"):
        for _ in range(args.rounds):
            for method in args.methods:
                comm.barrier()
                before = _wire_bytes() if first_on_host else 0
                (mine,) = blocks.block_worker([(shape, tuple(args.modes), args.width, method)], 1, args.repeats, False)
                comm.barrier()
                crossed = _wire_bytes() - before if first_on_host else 0
                ranks = comm.all_gather_object(mine)
                # Each byte leaves one host and enters the other; a warm-up and the timed passes ran.
                wire = sum(comm.all_gather_object(crossed)) / 2 / (1 + args.repeats)
                summary = blocks.summarise(ranks)
                payload = sum(b for _, b in summary["collectives"])
                rows[method].append(dict(forward_s=summary["forward"]["median"], wire_bytes=wire, payload=payload))
        if comm.rank() == 0:
            Path(args.result).write_text(json.dumps(rows))


def _launch(hosts, args: argparse.Namespace, result: Path) -> None:
    """One torchrun agent of 2 ranks per host running ``worker``; raises if one fails."""
    port = 29400 + os.getpid() % 500
    options = ["--shape", args.shape, "--modes", *map(str, args.modes), "--width", str(args.width)]
    options += ["--repeats", str(args.repeats), "--rounds", str(args.rounds), "--methods", *args.methods]
    agents = []
    for i in range(2):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2"]
        cmd += ["--node-rank", str(i), "--master-addr", hosts.address(0), "--master-port", str(port)]
        cmd += [__file__, "--worker", "--result", str(result), *options]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.interface(i), "OMP_NUM_THREADS": "1"}
        agents.append(hosts.popen(i, cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for agent in agents:
        _, err = agent.communicate(timeout=1800)
        if agent.returncode != 0:
            raise RuntimeError(f"a host failed:\n{err[-3000:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--modes", type=int, nargs=4, default=[8, 8, 8, 16])
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--rate", default="1gbit", help="the link's rate in each direction (tc units)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--methods", nargs="+", default=list(METHODS))
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "two_level.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(ROOT / "tests"))  # the namespace testbed is the tests' own
    from hosts import Hosts

    report = {}
    for rate in (args.rate, None):
        with Hosts(2) as hosts, tempfile.TemporaryDirectory() as tmp:
            hosts.rate_limit(rate)
            result = Path(tmp) / "rows.json"
            _launch(hosts, args, result)
            rows = json.loads(result.read_text())
        name = rate or "unlimited"
        report[name] = {
            m: dict(
                forward_ms=1e3 * statistics.median(r["forward_s"] for r in rs),
                wire_mb=statistics.median(r["wire_bytes"] for r in rs) / 1e6,
                payload_mb=rs[0]["payload"] / 1e6,
            )
            for m, rs in rows.items()
        }
        drift_ms = report[name]["drift"]["forward_ms"] if "drift" in report[name] else float("nan")
        for method, r in report[name].items():
            print(
                f"{name:>9} {method:11s} block forward {r['forward_ms']:8.1f} ms ({r['forward_ms'] / drift_ms:5.2f}x "
                f"drift)  across the link {r['wire_mb']:8.2f} MB a forward  rank 0's payload {r['payload_mb']:8.2f} MB",
                flush=True,
            )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(shape=args.shape, modes=args.modes, width=args.width, report=report), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
