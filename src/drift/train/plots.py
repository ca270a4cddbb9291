"""A finished run's plots (rank 0): the loss and test error per epoch, and a slice of a test prediction.
The only module that imports matplotlib, and only when it plots."""

from __future__ import annotations

from pathlib import Path

import torch
from torch.distributed.tensor import DTensor

from drift import comm
from drift.data import PDEBench3D
from drift.nn import FNO
from drift.train.sharding import Sharding, load_batch


def save_plots(
    out: Path, history: list[dict], model: FNO, test_set: PDEBench3D, sharding: Sharding, device, method: str
) -> None:
    """Rank 0: ``loss.png`` (loss and test relative L2 per epoch) and ``slice.png`` (density on the
    mid-z plane of the first test trajectory at the first and the last predicted time: prediction, truth,
    difference)."""
    with torch.no_grad():
        x, y = load_batch(test_set, [0], sharding, device)
        pred, true = model(x), sharding.wrap(y, x.shape[:1] + y.shape[1:2] + x.shape[2:])
    pred, true = (t.full_tensor() if isinstance(t, DTensor) else t for t in (pred, true))
    pred, true = pred[0, 0], true[0, 0]
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
    z, t_out = true.shape[2] // 2, true.shape[-1]
    fig, ax = plt.subplots(2, 3, figsize=(11, 7), constrained_layout=True)
    # The error grows with the lead time: the first predicted frame, then the last.
    for row, t in zip(ax, (0, t_out - 1), strict=True):
        truth, guess = true[:, :, z, t], pred[:, :, z, t]
        lo, hi = float(truth.min()), float(truth.max())
        panels = [("predicted", guess), ("true", truth), ("difference", guess - truth)]
        for a, (title, image) in zip(row, panels, strict=True):
            limits = dict(vmin=lo, vmax=hi) if title != "difference" else {}
            shown = a.imshow(image.cpu().numpy().T, origin="lower", cmap="viridis", **limits)
            a.set(title=f"density, {title}, step {t + 1}/{t_out}", xlabel="x", ylabel="y")
            fig.colorbar(shown, ax=a, shrink=0.8)
    fig.savefig(out / "slice.png", dpi=120)
    plt.close(fig)
