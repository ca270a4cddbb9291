"""Two hosts (or four) joined by a rate-limited link: the two-level comm model, and every method's FNO block.

The hosts are network namespaces on one switch (tests/hosts.py; needs root and iproute2), each running a
torchrun agent (static rendezvous); every host's link is limited to ``--rate`` in both directions with a
``tbf`` qdisc (netem is not available), and the same runs again on the unlimited link. In each setting
one launch

1. sends 16 MB from the first host to the second and back (``send``/``recv``): the rate achieved each way;
2. times the collectives drift uses (reduce-scatter, all-gather, all-to-all; mean of ``--sweep-repeats``
   calls, or of as many as make 8 MB, slowest rank) over ``--sizes-kib`` on three kinds of group: within
   a host (every host's group at once), across hosts (one rank a host; every such group at once) and all
   ranks;
3. fits ``drift.cost.Machine``'s two levels on the even-numbered sizes (alpha and beta within a host
   from the within-host groups, the link's from the across-host ones; least squares in relative error)
   and predicts the odd-numbered sizes of those groups and every size of the all-rank group, which is
   never fitted;
4. times one FNO block (``drift.bench.blocks.block_worker``) per variant, interleaved in ``--rounds``
   rounds: dfno, dfno-pruned, drift flat, drift with a two-level reduction, each drift with ``overlap``,
   and ``method="auto", reduction="auto"`` on the fitted machine: its forward every round; in the first
   round (``--steps``) also forward plus backward, the block's part of a training step, and the bytes
   that cross the link per forward, counted at the interfaces (the kernel's counters of each host's
   ``eth0`` around ``--repeats`` forwards of a block already built and warm).

The driver then predicts each unoverlapped variant's block forward on the limited link: its computation
(the forward less its collectives, measured on the unlimited link) plus the fitted model's time of the
collectives it issued (drift's comm log: kind, bytes, group), and bounds the ratios any drift variant can
reach on the limited link: a slower link only adds waits, so drift's fastest forward on the unlimited one is
a floor. ``--variants`` times only the variants named (e.g. ``dfno 'drift 2x2'``).

    sudo python benchmarks/two_level.py [--shape 64x64x32x30] [--rate 1gbit] [--hosts 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from drift.arguments import shape as shape_arg

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("reduce_scatter", "all_gather", "all_to_all")
PROBE_BYTES = 16 << 20


def _wire_bytes() -> int:
    """Bytes this host's link has sent and received so far (its namespace's view of ``eth0``)."""
    stats = Path("/sys/class/net/eth0/statistics")
    return sum(int((stats / name).read_text()) for name in ("tx_bytes", "rx_bytes"))


def variants(per_host: int, hosts: int, overlap: int) -> dict[str, tuple[str, dict]]:
    """Name -> (method, parallelize options) of every block this benchmark times: drift's reduction is
    (hosts, ranks a host), or with one rank a host (2, hosts / 2): both levels across hosts."""
    shape = (hosts, per_host) if per_host > 1 else (2, hosts // 2)
    tree = {"reduction": shape}
    name = "x".join(map(str, shape))
    return {
        "dfno": ("dfno", {}),
        "dfno-pruned": ("dfno-pruned", {}),
        "drift": ("drift", {}),
        f"drift {name}": ("drift", tree),
        f"drift overlap {overlap}": ("drift", {"overlap": overlap}),
        f"drift {name} overlap {overlap}": ("drift", {**tree, "overlap": overlap}),
        "auto": ("auto", {"reduction": "auto"}),
    }


def _chosen(name: str, chosen: list[str] | None) -> bool:
    """Whether variant ``name`` is among ``--variants`` (all of them when None)."""
    return chosen is None or name in chosen


# --- the model: regressors, fit, strides ---------------------------------------------------------


def _machine(alpha, beta, link_alpha, link_beta, per_host):
    from drift.cost import Hosts, Machine

    default = Machine.default("cpu")
    hosts = Hosts(per_host, link_alpha, link_beta)
    rates = (default.matmul_flops_per_s, default.fft_flops_per_s)
    return Machine(*rates, alpha, beta, hosts, True, copy_s_per_byte=default.copy_s_per_byte)


def _regressors(kind: str, ranks: int, nbytes: float, stride: int, per_host: int) -> list[float]:
    """The model's time as ``[alpha, beta, link alpha, link beta] . x``: x from unit machines."""
    return [
        _machine(*unit, per_host).collective_s(kind, ranks, nbytes, stride)
        for unit in ((1, 0, 0, 0), (0, 1, 0, 0), (0, 0, 1, 0), (0, 0, 0, 1))
    ]


def fit(rows: list[dict], per_host: int) -> dict:
    """alpha and beta within a host and of the link, each pair fitted on its groups' even-numbered sizes."""
    import numpy as np

    from drift.cost import non_negative_lstsq

    sizes = sorted({r["bytes"] for r in rows})
    fitted = set(sizes[::2])
    coef = [0.0] * 4
    for group, columns in (("within", (0, 1)), ("across", (2, 3))):
        points = [r for r in rows if r["group"] == group and r["bytes"] in fitted]
        if not points:
            continue
        x = np.array(
            [
                [_regressors(r["kind"], r["ranks"], r["bytes"], r["stride"], per_host)[c] for c in columns]
                for r in points
            ]
        )
        t = np.array([r["seconds"] for r in points])
        for c, value in zip(columns, non_negative_lstsq(x / t[:, None], np.ones_like(t)), strict=True):
            coef[c] = float(value)
    return dict(
        alpha_s=coef[0],
        beta_s_per_byte=coef[1],
        link_alpha_s=coef[2],
        link_beta_s_per_byte=coef[3],
        fitted_bytes=sorted(fitted),
    )


def predict(model: dict, kind: str, ranks: int, nbytes: float, stride: int, per_host: int) -> float:
    x = _regressors(kind, ranks, nbytes, stride, per_host)
    terms = (model["alpha_s"], model["beta_s_per_byte"], model["link_alpha_s"], model["link_beta_s_per_byte"])
    return sum(a * b for a, b in zip(x, terms, strict=True))


def call_strides(calls: list[list], per_host: int, world: int) -> list[int]:
    """The stride of each logged collective ``(kind, bytes, group size)`` of a block on a slab of ``world``
    ranks: the flat group is every rank (stride 1); a two-level reduction's reduce-scatters go over its
    inner level first (stride 1), then its outer one (stride: the inner level's ranks), its all-gathers
    the other way."""
    strides, seen = [], {"reduce_scatter": 0, "all_gather": 0}
    for kind, _, size in calls:
        if size == world or kind not in seen:
            strides.append(1)
            continue
        first = seen[kind] % 2 == 0
        seen[kind] += 1
        inner_first = kind == "reduce_scatter"
        strides.append(1 if first == inner_first else world // size)
    return strides


# --- on every rank under torchrun ---------------------------------------------------------------


def _probe(per_host: int) -> dict:
    """MB/s from rank 0 (host 0) to the first rank of host 1 and back."""
    import torch
    import torch.distributed as dist

    rank, peer = dist.get_rank(), per_host
    buffer = torch.zeros(PROBE_BYTES // 4)
    rates = {}
    for name, src, dst in (("out", 0, peer), ("back", peer, 0)):
        dist.barrier()
        began = time.perf_counter()
        if rank == src:
            dist.send(buffer, dst)
            dist.recv(buffer[:1], dst)  # the receiver's acknowledgement: the whole message arrived
        elif rank == dst:
            dist.recv(buffer, src)
            dist.send(buffer[:1], src)
        rates[name] = PROBE_BYTES / (time.perf_counter() - began) / 1e6
        dist.barrier()
    return rates


def _sweep(sizes: list[int], repeats: int, per_host: int) -> list[dict]:
    """Mean seconds of each collective over each group kind and size (slowest rank)."""
    import torch
    import torch.distributed as dist

    from drift import comm

    world, rank = dist.get_world_size(), dist.get_rank()
    hosts = world // per_host
    within = [dist.new_group(list(range(h * per_host, (h + 1) * per_host))) for h in range(hosts)]
    across = [dist.new_group(list(range(i, world, per_host))) for i in range(per_host)]
    groups = [("across", across[rank % per_host], hosts, per_host), ("all", None, world, 1)]
    if per_host > 1:
        groups.insert(0, ("within", within[rank // per_host], per_host, 1))
    rows = []
    for name, group, size, stride in groups:
        for kind in KINDS:
            for nbytes in sizes:
                per_rank = nbytes // (4 * size)
                counts = [per_rank] * size

                def call(kind=kind, group=group, size=size, per_rank=per_rank, counts=counts):
                    if kind == "reduce_scatter":
                        return comm.reduce_scatter(torch.ones(size, per_rank), group=group)
                    if kind == "all_gather":
                        return comm.all_gather(torch.ones(per_rank), group=group)
                    return comm.all_to_all(torch.ones(per_rank * size), counts, counts, group=group)

                call()
                dist.barrier()
                # Small collectives vary most from call to call: at least 8 MB of calls each.
                calls = max(repeats, (8 << 20) // nbytes)
                began = time.perf_counter()
                for _ in range(calls):
                    call()
                seconds = torch.tensor((time.perf_counter() - began) / calls)
                dist.all_reduce(seconds, op=dist.ReduceOp.MAX)
                whole = per_rank * 4 * size
                rows.append(dict(group=name, kind=kind, ranks=size, stride=stride, bytes=whole, seconds=float(seconds)))
    return rows


def _wire_per_forward(case: tuple, repeats: int, first_on_host: bool) -> float:
    """Bytes that cross the link in one block forward: the hosts' interface counters around ``repeats``
    forwards of the block ``case`` (built and warmed up before, as ``block_worker`` builds it)."""
    import functools

    import torch

    from drift import comm
    from drift.bench import blocks
    from drift.jobs.launch import rank_device
    from drift.nn import PointwiseLinear, SpectralConv, fno_block

    shape, modes, width, method, options = case
    torch.manual_seed(0)
    conv = SpectralConv(width, width, modes, method=method, device=rank_device())
    linear = PointwiseLinear(width, width, device=rank_device())
    layout = blocks.distribute(torch.nn.ModuleList([conv, linear]), shape, **options)
    block = functools.partial(fno_block, conv, linear, layout=layout)
    x = blocks.random_input(layout, width)
    with torch.no_grad():
        block(x)
        comm.barrier()
        before = _wire_bytes() if first_on_host else 0
        for _ in range(repeats):
            block(x)
        comm.barrier()
    crossed = _wire_bytes() - before if first_on_host else 0
    # Each byte leaves one host and enters another: counted once at each; the barriers' bytes are few.
    return sum(comm.all_gather_object(crossed)) / 2 / repeats


def worker(args: argparse.Namespace) -> None:
    """On every rank: the probe, the sweep, the fit (rank 0), the blocks; rank 0 writes the results."""
    import torch

    from drift import comm
    from drift.bench import blocks
    from drift.jobs.launch import process_group
    from drift.nn import PointwiseLinear, SpectralConv

    torch.set_num_threads(1)
    shape = args.shape
    per_host = int(os.environ["LOCAL_WORLD_SIZE"])
    first_on_host = os.environ.get("LOCAL_RANK") == "0"
    with process_group("cpu"):
        world = comm.world_size()
        hosts = world // per_host
        rates = _probe(per_host)
        sweep = _sweep([kib * 1024 for kib in args.sizes_kib], args.sweep_repeats, per_host)
        model = comm.broadcast_object(fit(sweep, per_host) if comm.rank() == 0 else None)
        terms = (model["alpha_s"], model["beta_s_per_byte"], model["link_alpha_s"], model["link_beta_s_per_byte"])
        machine = _machine(*terms, per_host)
        named = {k: v for k, v in variants(per_host, hosts, args.overlap).items() if _chosen(k, args.variants)}
        rows: dict[str, list] = {name: [] for name in named}
        choice = None
        for _ in range(args.rounds):
            for name, (method, options) in named.items():
                if method == "auto":
                    options = {**options, "global_shape": shape, "machine": machine}
                case = (shape, tuple(args.modes), args.width, method, options)
                (mine,) = blocks.block_worker([case], 1, args.repeats, False)
                first_round = not rows[name]
                (step,) = blocks.block_worker([case], 1, args.repeats, True) if args.steps and first_round else (None,)
                wire = _wire_per_forward(case, args.repeats, first_on_host) if first_round else None
                ranks = comm.all_gather_object(mine)
                summary = blocks.summarise(ranks)
                forward = summary["forward"]["median"]
                rows[name].append(
                    dict(
                        forward_s=forward,
                        step_s=forward + statistics.median(step["backward_s"]) if step else None,
                        collectives_s=summary["phases_s"]["collectives"],
                        phases_s=summary["phases_s"],
                        wire_bytes=wire,
                        calls=ranks[0]["collectives"],
                    )
                )
                if method == "auto" and choice is None:
                    conv = SpectralConv(args.width, args.width, tuple(args.modes), method="auto")
                    blocks.distribute(
                        torch.nn.ModuleList([conv, PointwiseLinear(args.width, args.width)]), shape, **options
                    )
                    reduction = None if conv.reduction is None else tuple(conv.reduction.shape)
                    choice = dict(method=conv.method, reduction=reduction, why=str(conv.choice))
        if comm.rank() == 0:
            result = dict(
                rates=rates, sweep=sweep, model=model, blocks=rows, auto=choice, per_host=per_host, world=world
            )
            Path(args.result).write_text(json.dumps(result))


# --- the driver -----------------------------------------------------------------------------------


def _launch(hosts, per_host: int, args: argparse.Namespace, result: Path) -> None:
    """One torchrun agent of ``per_host`` ranks per host running ``worker``; raises if one fails."""
    port = 29400 + os.getpid() % 500
    options = ["--shape", "x".join(map(str, args.shape)), "--modes", *map(str, args.modes), "--width", str(args.width)]
    options += ["--repeats", str(args.repeats), "--rounds", str(args.rounds), "--overlap", str(args.overlap)]
    options += ["--sizes-kib", *map(str, args.sizes_kib), "--sweep-repeats", str(args.sweep_repeats)]
    options += ["--steps"] if args.steps else []
    options += ["--variants", *args.variants] if args.variants else []
    agents = []
    for i in range(hosts.n):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(hosts.n)]
        cmd += ["--nproc-per-node", str(per_host), "--node-rank", str(i)]
        cmd += ["--master-addr", hosts.address(0), "--master-port", str(port)]
        cmd += [__file__, "--worker", "--result", str(result), *options]
        env = {**os.environ, "GLOO_SOCKET_IFNAME": hosts.interface(i), "OMP_NUM_THREADS": "1"}
        agents.append(hosts.popen(i, cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    for agent in agents:
        _, err = agent.communicate(timeout=3600)
        if agent.returncode != 0:
            raise RuntimeError(f"a host failed:\n{err[-3000:]}")


def _rate(beta: float) -> str:
    return f"{1e-6 / beta:.0f} MB/s" if beta > 0 else "no bandwidth term"


def _median(rows: list[dict], key: str) -> float | None:
    values = [r[key] for r in rows if r[key] is not None]
    return statistics.median(values) if values else None


def _report(name: str, result: dict, unlimited: dict | None) -> dict:
    """Print one setting's figures; returns its summary."""
    per_host, world, model, rates = result["per_host"], result["world"], result["model"], result["rates"]
    print(f"\n== {name}: {world // per_host} hosts x {per_host} ranks")
    print(f"   link achieved {rates['out']:.0f} MB/s from host 0 to host 1, {rates['back']:.0f} MB/s back")
    within, link = _rate(model["beta_s_per_byte"]), _rate(model["link_beta_s_per_byte"])
    alphas = f"alpha {model['alpha_s'] * 1e6:.0f} us", f"alpha {model['link_alpha_s'] * 1e6:.0f} us"
    print(f"   fit: within a host {alphas[0]}, {within}; link {alphas[1]}, {link}")
    errors: dict[str, list[float]] = {}
    for r in result["sweep"]:
        if r["group"] != "all" and r["bytes"] in model["fitted_bytes"]:
            continue
        e = abs(predict(model, r["kind"], r["ranks"], r["bytes"], r["stride"], per_host) - r["seconds"]) / r["seconds"]
        errors.setdefault(r["group"], []).append(e)
    held_out = {}
    for group, es in errors.items():
        good = sum(e <= 0.25 for e in es)
        print(f"   held-out {group:7s} collectives: {good}/{len(es)} within 25%, largest error {max(es):.0%}")
        held_out[group] = dict(within_25=good, points=len(es), max_error=max(es))
    drift_s, dfno_s, pruned_s = (_median(result["blocks"][v], "forward_s") for v in ("drift", "dfno", "dfno-pruned"))
    blocks = {}
    for variant, rows in result["blocks"].items():
        forward, step, wire = _median(rows, "forward_s"), _median(rows, "step_s"), _median(rows, "wire_bytes")
        row = dict(forward_ms=forward * 1e3, step_ms=step and step * 1e3, wire_mb=wire / 1e6)
        row |= dict(dfno_over=dfno_s / forward, pruned_over=pruned_s / forward)
        text = f"  step {step * 1e3:8.1f} ms" if step else ""
        if unlimited is not None:
            if "overlap" not in variant and variant != "auto":
                calls = rows[0]["calls"]
                strides = call_strides(calls, per_host, world)
                # The comm log holds what a rank hands in (an all-gather's one share); the model takes
                # the whole buffer.
                comm_s = sum(
                    predict(model, k, s, b * s if k == "all_gather" else b, st, per_host)
                    for (k, b, s), st in zip(calls, strides, strict=True)
                )
                compute = statistics.median(r["forward_s"] - r["collectives_s"] for r in unlimited["blocks"][variant])
                row["predicted_ms"] = (compute + comm_s) * 1e3
                text += (
                    f"  predicted {row['predicted_ms']:7.1f} ms ({row['predicted_ms'] / row['forward_ms'] - 1:+.0%})"
                )
            row["over_unlimited"] = forward / _median(unlimited["blocks"][variant], "forward_s")
            text += f"  {row['over_unlimited']:.2f}x its unlimited"
        print(
            f"   {variant:22s} forward {forward * 1e3:8.1f} ms (dfno/it {dfno_s / forward:5.1f}x, dfno-pruned/it "
            f"{pruned_s / forward:4.1f}x, it/drift {forward / drift_s:4.2f}x)"
            f"  across the link {wire / 1e6:7.2f} MB{text}"
        )
        phases = {k: statistics.median(r["phases_s"][k] for r in rows) for k in rows[0]["phases_s"]}
        print("      phases (ms, mean over ranks): " + ", ".join(f"{k} {v * 1e3:.0f}" for k, v in phases.items()))
        row["phases_ms"] = {k: v * 1e3 for k, v in phases.items()}
        blocks[variant] = row
    if result["auto"]:
        auto = result["auto"]
        print(f"   auto: {auto['method']} with reduction {auto['reduction']} ({auto['why']})")
    bound = None
    if unlimited is not None:
        # A slower link only adds waits: drift's fastest forward on the unlimited link bounds its forward here,
        # so dfno's and dfno-pruned's times here over it bound the ratios any drift variant can reach.
        floor = min(_median(rows, "forward_s") for v, rows in unlimited["blocks"].items() if v.startswith("drift"))
        bound = dict(floor_ms=floor * 1e3, dfno_over=dfno_s / floor, pruned_over=pruned_s / floor)
        print(
            f"   bound: drift's fastest forward on the unlimited link, {floor * 1e3:.1f} ms, allows at most "
            f"dfno/it {bound['dfno_over']:.1f}x, dfno-pruned/it {bound['pruned_over']:.1f}x here"
        )
    return dict(rates_mb_s=rates, model=model, held_out=held_out, blocks=blocks, auto=result["auto"], bound=bound)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=shape_arg, default=shape_arg("64x64x32x30"))
    parser.add_argument("--modes", type=int, nargs=4, default=[8, 8, 8, 16])
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--rate", default="1gbit", help="the link's rate in each direction (tc units)")
    parser.add_argument("--hosts", type=int, nargs="+", default=[2, 4], help="host counts (4 ranks in all)")
    parser.add_argument("--overlap", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", help="only these variants (default: all), e.g. dfno 'drift 2x2'")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", action="store_true", help="also time forward plus backward")
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=[128, 256, 512, 1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--sweep-repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=ROOT / "results" / "two_level.json")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    args = parser.parse_args()
    known = variants(2, 2, args.overlap)  # the same names on 4 hosts of one rank
    if args.variants and set(args.variants) - set(known):
        parser.error(f"--variants: no variant {sorted(set(args.variants) - set(known))}; there are {list(known)}")
    if args.worker:
        worker(args)
        return
    sys.path.insert(0, str(ROOT / "tests"))  # the namespace testbed is the tests' own
    from hosts import Hosts

    report = {}
    where = f"{'x'.join(map(str, args.shape))}, modes {args.modes}, width {args.width}"
    print(f"{where}, 4 ranks of one thread on {os.cpu_count()} cores")
    for n in args.hosts:
        results = {}
        for rate in (None, args.rate):  # the unlimited link first: the predictions take its computation
            with Hosts(n) as hosts, tempfile.TemporaryDirectory() as tmp:
                hosts.rate_limit(rate)
                result = Path(tmp) / "result.json"
                _launch(hosts, 4 // n, args, result)
                results[rate] = json.loads(result.read_text())
            name = f"{n} hosts, {rate or 'unlimited'}"
            report[name] = _report(name, results[rate], results[None] if rate else None)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(dict(shape=args.shape, modes=args.modes, width=args.width, report=report), indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
