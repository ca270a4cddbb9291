"""A finished run's plots (rank 0): the loss and test error per epoch, and a slice of a test prediction.
The only module that imports matplotlib, and only when it plots."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from drift import comm
from drift.data import Trajectories
from drift.nn import FNO
from drift.train.sharding import Sharding, load_batch


def save_plots(
    out: Path,
    history: list[dict],
    model: FNO,
    test_set: Trajectories,
    sharding: Sharding,
    device,
    method: str,
    per_frame: dict | None = None,
) -> None:
    """Rank 0: ``loss.png`` (loss and test relative L2 per epoch), ``slice.png`` (the first field of the
    first test trajectory at the first and the last predicted frame: prediction, truth, difference; a
    line for 1-D data, the field for 2-D, its middle plane along the last dim for 3-D) and, given the
    final metrics' ``per_frame`` (``drift.metrics``), ``rollout.png``: the test nRMSE per predicted frame."""
    with torch.no_grad():
        x, y, wrap = load_batch(test_set, [0], sharding, device)
        pred = wrap(test_set.recipe.predict(model, x, wrap, test_set.t_out))
        true = wrap(y)
    pred, true = (t.full_tensor() if isinstance(t, DTensor) else t for t in (pred, true))
    pred, true = pred[0, 0], true[0, 0]  # (*space, frames)
    if pred.dim() == 4:  # 3-D: the middle plane along z
        pred, true = pred.select(2, pred.shape[2] // 2), true.select(2, true.shape[2] // 2)
    if comm.rank() != 0:
        return
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    epochs = [r["epoch"] for r in history]
    fig, ax = plt.subplots(1, 2, figsize=(9, 3.5), constrained_layout=True)
    ax[0].semilogy(epochs, [r["train_loss"] for r in history], "o-")
    ax[0].set(xlabel="epoch", ylabel="training loss (MSE, normalised)", title=f"{method}: loss")
    ax[1].plot(epochs, [r["test_rel_l2"] for r in history], "o-", color="C1")
    ax[1].set(xlabel="epoch", ylabel="relative L2", title="test relative L2")
    fig.savefig(out / "loss.png", dpi=120)
    plt.close(fig)
    t_out, field = true.shape[-1], test_set.fields[0]
    fig, ax = plt.subplots(2, 3, figsize=(11, 7), constrained_layout=True)
    # The error grows with the lead time: the first predicted frame, then the last.
    for row, t in zip(ax, (0, t_out - 1), strict=True):
        truth, guess = true[..., t].cpu().numpy(), pred[..., t].cpu().numpy()
        lo, hi = float(truth.min()), float(truth.max())
        panels = [("predicted", guess), ("true", truth), ("difference", guess - truth)]
        for a, (title, image) in zip(row, panels, strict=True):
            a.set(title=f"{field}, {title}, frame {t + 1}/{t_out}", xlabel="x")
            if image.ndim == 1:
                a.plot(image)
                continue
            limits = dict(vmin=lo, vmax=hi) if title != "difference" else {}
            shown = a.imshow(image.T, origin="lower", cmap="viridis", **limits)
            a.set(ylabel="y")
            fig.colorbar(shown, ax=a, shrink=0.8)
    fig.savefig(out / "slice.png", dpi=120)
    plt.close(fig)
    if per_frame is not None:
        fig, ax = plt.subplots(figsize=(5, 3.5), constrained_layout=True)
        frames = range(1, len(per_frame["nrmse"]) + 1)
        ax.plot(frames, per_frame["nrmse"], "o-")
        ax.set(xlabel="predicted frame", ylabel="nRMSE (PDEBench)", title=f"{method}: test error per frame")
        fig.savefig(out / "rollout.png", dpi=120)
        plt.close(fig)
