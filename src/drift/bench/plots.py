"""PNG plots of the ``drift bench`` results (matplotlib, Agg backend, imported on first use)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only: no display on compute nodes
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    fig.clf()


def comm(rows: Sequence[dict], fit_for: Callable[[str, int], Any], path: Path) -> None:
    """Mean seconds per call against message size, per collective and P (quartiles as bars), with the
    fitted model of each P: ``fit_for(kind, P)``, a ``drift.cost.Fit`` (or None)."""
    plt = _pyplot()
    kinds = sorted({r["kind"] for r in rows})
    fig, axes = plt.subplots(1, max(1, len(kinds)), figsize=(4 * max(1, len(kinds)), 3.4), squeeze=False)
    for ax, kind in zip(axes[0], kinds, strict=False):
        for size in sorted({r["ranks"] for r in rows if r["kind"] == kind}):
            fit = fit_for(kind, size)
            mine = sorted((r for r in rows if r["kind"] == kind and r["ranks"] == size), key=lambda r: r["bytes"])
            n = [r["bytes"] for r in mine]
            mean = [r["seconds"]["mean"] for r in mine]
            bars = [[m - r["seconds"]["q1"] for m, r in zip(mean, mine, strict=True)]]
            bars.append([r["seconds"]["q3"] - m for m, r in zip(mean, mine, strict=True)])
            line = ax.errorbar(n, mean, yerr=np.clip(bars, 0, None), fmt="o", capsize=2, label=f"P={size}")[0]
            dense = np.geomspace(n[0], n[-1], 200)  # the model's step at S shows as a step
            ax.plot(dense, [fit.predict(kind, size, b) for b in dense], "-", color=line.get_color(), alpha=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(kind)
        ax.set_xlabel("message bytes")
        ax.set_ylabel("seconds per call")
        ax.legend(fontsize=7)
    _save(fig, path)


def projection(rows: Sequence[dict], cluster: str, path: Path) -> None:
    """Projected forward time of one block against P for drift and dfno (a model)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ranks = [r["ranks"] for r in rows]
    for name in ("drift", "dfno"):
        ax.loglog(ranks, [r[name]["total_s"] * 1e3 for r in rows], "o-", label=f"{name} total")
        ax.loglog(ranks, [r[name]["comm_s"] * 1e3 for r in rows], "--", label=f"{name} communication")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("ranks P")
    ax.set_ylabel("ms per block forward")
    ax.set_title(f"projection (model) on cluster '{cluster}'")
    ax.legend(fontsize=7)
    _save(fig, path)


def timings(rows: Sequence[dict], x: str, xlabel: str, title: str, path: Path) -> None:
    """Forward (and backward, when measured) median seconds against ``x`` per method, with the quartiles."""
    plt = _pyplot()
    passes = [p for p in ("forward", "backward") if any(r.get(p) for r in rows)]
    if not passes:
        return
    fig, axes = plt.subplots(1, len(passes), figsize=(4.5 * len(passes), 3.6), squeeze=False)
    for ax, which in zip(axes[0], passes, strict=True):
        for method in sorted({r["method"] for r in rows}):
            mine = sorted((r for r in rows if r["method"] == method and r.get(which)), key=lambda r: r[x])
            xs = [r[x] for r in mine]
            med = [r[which]["median"] * 1e3 for r in mine]
            ax.plot(xs, med, "o-", label=method)
            ax.fill_between(xs, [r[which]["q1"] * 1e3 for r in mine], [r[which]["q3"] * 1e3 for r in mine], alpha=0.2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"{which} ms")
        ax.set_title(f"{title}: {which}")
        ax.legend(fontsize=7)
    _save(fig, path)


def heatmap(labels: Sequence[str], phases: Sequence[str], ms: Sequence[Sequence[float]], path: Path) -> None:
    """The paper's Figure 9: rows (method, P), columns phases; colour is the share of the row's total,
    the text the milliseconds."""
    plt = _pyplot()
    shares = [[v / max(sum(row), 1e-12) for v in row] for row in ms]
    fig, ax = plt.subplots(figsize=(1.4 * len(phases) + 2, 0.45 * len(labels) + 1.5))
    ax.imshow(shares, cmap="viridis", vmin=0, vmax=1, aspect="auto")
    ax.set_xticks(range(len(phases)), phases, rotation=20, fontsize=8)
    ax.set_yticks(range(len(labels)), labels, fontsize=8)
    for i, row in enumerate(ms):
        for j, v in enumerate(row):
            ax.text(j, i, f"{v:.0f}", ha="center", va="center", fontsize=7, color="w" if shares[i][j] < 0.5 else "k")
    ax.set_title("ms per FNO forward by phase (colour: share of the total)")
    _save(fig, path)


def capacity(rows: Sequence[dict], path: Path) -> None:
    """The largest n found per (grid, method, pass) against P."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for key in sorted({(r["dims"], r["method"], r["pass"]) for r in rows}):
        mine = [r for r in rows if (r["dims"], r["method"], r["pass"]) == key and r["largest_n"]]
        mine.sort(key=lambda r: r["ranks"])
        ax.plot([r["ranks"] for r in mine], [r["largest_n"] for r in mine], "o-", label="{}D {} {}".format(*key))
    ax.set_xlabel("ranks P")
    ax.set_ylabel("largest n that fits (none: not drawn)")
    ax.set_title("capacity under the memory cap")
    ax.legend(fontsize=7)
    _save(fig, path)
