"""The training loop: ``train`` (every rank of a group, or one alone) and ``train_rank`` (one rank of
``drift train``: the process group, the data, the checks, then ``train``). A run is set up
(``drift.train.run``), then each epoch takes its steps in a permutation drawn from the seed and the
epoch, and ends with the test pass, its metrics row and a checkpoint; a signal stops every rank at a
step boundary with a checkpoint (``Stopped``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from drift import comm
from drift.budget import MemoryWatch, peak_bytes
from drift.checkpoint import save_checkpoint
from drift.data import Prefetch
from drift.jobs.cluster import Cluster, PeersLost, describe
from drift.jobs.console import bars_shown
from drift.jobs.launch import launched, pooled, process_group, rank_device
from drift.jobs.stopping import STOPPED, Stopped, StopSignals
from drift.jobs.timeouts import PhaseTimeouts
from drift.metrics import PDEBenchMetrics
from drift.recipes import Unroll
from drift.train import losses
from drift.train.checks import check_config
from drift.train.config import TrainConfig, default_data_path, ensure_default_data
from drift.train.epoch import EpochSums, PhaseClock, step_flags
from drift.train.evaluation import pdebench_metrics, relative_l2, write_test_metrics
from drift.train.plots import save_plots
from drift.train.resume import newest_checkpoint, one_writer
from drift.train.run import Run, set_up
from drift.train.schedule import set_learning_rate
from drift.train.sharding import batch_input, prefetched_batches


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient norm stopped training; the message names the epoch, step and trajectories."""


def train(config: TrainConfig, stop: StopSignals | None = None) -> list[dict]:
    """Train on this rank's blocks (call on every rank of the default group, or alone); returns the
    per-epoch metrics (the same on every rank). Rank 0 holds ``config.out``'s lock (FolderInUse if
    another run does) and writes ``metrics.jsonl``, ``stats.json``, ``checkpoints/``, and at the end
    ``loss.png``, ``slice.png`` and ``test_metrics.json`` (the final model's relative L2 and PDEBench
    metrics, after a run that reached its last epoch). A non-finite loss or gradient norm raises
    NonFiniteError before the optimizer step, or with ``on_nan="skip-batch"`` skips the batch
    (``skipped_batches`` per epoch).

    Across hosts: ClusterError when the hosts run other drift or torch versions or do not share
    ``config.out``; each phase's collectives time out after a bound that fits it (``PhaseTimeouts``), and
    a peer that stops answering ends every rank with ``PeersLost`` naming its node and address. SIGTERM or
    SIGUSR1 (``drift.jobs.stopping``) stops every rank at the next step boundary with a mid-epoch checkpoint:
    ``Stopped``; ``stop``: signals already being caught (by default from here on)."""
    cluster = Cluster.join() if comm.world_size() > 1 else None
    timeouts = PhaseTimeouts(config.collective_timeout)
    try:
        if cluster is not None:
            cluster.check_shared(config.out)
        with contextlib.ExitStack() as stack:
            stop = stop or stack.enter_context(StopSignals())
            stack.enter_context(one_writer(Path(config.out)))
            return _train(config, stop, timeouts)
    except RuntimeError as exc:
        # A collective that failed (Gloo raises a plain RuntimeError): which peers stopped answering?
        if cluster is None or not (type(exc) is RuntimeError or isinstance(exc, torch.distributed.DistError)):
            raise
        silent = cluster.silent()
        if not silent:
            raise
        raise PeersLost(
            f"{describe(silent)} stopped answering during {timeouts.doing()}; the newest checkpoint: "
            f"{newest_checkpoint(Path(config.out))}"
        ) from exc
    finally:
        if cluster is not None:
            cluster.close()


def _train(config: TrainConfig, stop: StopSignals, timeouts: PhaseTimeouts) -> list[dict]:
    """``train`` inside the lock: set up, the epochs not yet done, then the final metrics and the plots."""
    run = set_up(config, stop, timeouts)
    bar = tqdm(
        range(run.start, config.epochs),
        desc=f"{config.method} P={comm.world_size()}",
        unit="epoch",
        disable=run.rank != 0 or config.quiet or not bars_shown(config.progress),
        initial=run.start,
        total=config.epochs,
    )
    run.last_checkpoint = time.monotonic()
    final = test_l2 = None
    schedule = {epoch: _batches(run, epoch) for epoch in range(run.start, config.epochs)}
    # The steps not done yet, read one ahead across the epochs too: the next epoch's first batch is read
    # during an epoch's end.
    todo = [b for epoch, every in schedule.items() for b in every[_resumed_sums(run, epoch).step :]]
    with prefetched_batches(run.train_set, todo, run.sharding, run.device, config.prefetch) as batches:
        for epoch in bar:
            final, test_l2 = _epoch(run, bar, epoch, schedule[epoch], batches)
    bar.close()
    pdebench = final.compute() if final is not None else None
    if pdebench is not None:
        write_test_metrics(run.out, config.split, run.history[-1]["epoch"], test_l2, pdebench, not config.quiet)
    if run.history and config.plots:
        per_frame = pdebench["per_frame"] if pdebench is not None else None
        save_plots(run.out, run.history, run.model, run.test_set, run.sharding, run.device, config.method, per_frame)
    return run.history


def _resumed_sums(run: Run, epoch: int) -> EpochSums:
    """Epoch ``epoch``'s sums so far: the mid-epoch checkpoint's this run resumed from, else none."""
    return EpochSums.resumed(run.saved.get("partial") if run.saved and epoch == run.start else None)


def _batches(run: Run, epoch: int) -> list[list[int]]:
    """Epoch ``epoch``'s batches of training trajectory indices, one a step, in a permutation seeded by the
    epoch (the same on every rank: each reads its block of its share of the same batches)."""
    config = run.config
    order = torch.randperm(len(run.train_set), generator=torch.Generator().manual_seed(config.seed * 100_003 + epoch))
    return [order[first : first + config.batch_size].tolist() for first in range(0, len(order), config.batch_size)]


def _epoch(
    run: Run, bar: tqdm, epoch: int, every: list[list[int]], batches: Prefetch
) -> tuple[PDEBenchMetrics | None, float]:
    """Epoch ``epoch`` (from 0): its steps not yet done (a resumed run's epoch continues after the
    mid-epoch checkpoint it resumed from) on the batches ``every`` (``_batches``), read as ``batches``'
    next ones, then its end (``_end_epoch``, whose results it returns)."""
    config, began = run.config, time.perf_counter()
    sums = _resumed_sums(run, epoch)
    clock = PhaseClock(run.device)
    steps = len(every)
    for step, indices in enumerate(every[sums.step :], sums.step + 1):
        set_learning_rate(run.optimizer, config, epoch * steps + step - 1, config.epochs * steps)
        flags = _step(run, clock, sums, indices, batches, f"epoch {epoch + 1}, step {step}", run.unroll(epoch, step))
        sums.step = step
        if flags["stop"] or flags["checkpoint"]:
            _save_mid_epoch(run, epoch, step, sums, stop=flags["stop"])
    return _end_epoch(run, bar, epoch, sums, clock, began)


def _step(
    run: Run, clock: PhaseClock, sums: EpochSums, indices: list[int], batches: Prefetch, at: str, unroll: Unroll
) -> dict[str, bool]:
    """One step on the training trajectories ``indices`` (``at``: its epoch and step), read by ``batches``'
    next ``take()``: forward (as the recipe trains: ``unroll``), backward, the flags the ranks agree on
    (``step_flags``, returned), then the optimizer step; a non-finite loss or gradient norm raises
    NonFiniteError before it, or (``--on-nan skip-batch``) skips it. Adds to ``sums``. A failed read raises
    its DataError here, in the data phase."""
    model, optimizer = run.model, run.optimizer
    with run.timeouts("step", at):
        with clock("data"):
            x, y, wrap = batch_input(run.train_set, batches.take(), len(indices), run.sharding, run.device)
        with clock("forward"):
            recipe, t_out = run.train_set.recipe, run.train_set.t_out
            pred = recipe.train_forward(model, x, wrap, t_out, unroll)
            counted = recipe.counted(t_out, unroll)  # the frames the loss counts
            y = y[..., counted]
            # This rank's share of the global batch's loss: the ranks' losses sum to it.
            if run.config.loss in ("relative-l2", "nrmse"):
                rows = [indices.index(i) for i in run.sharding.share(indices)]
                loss = losses.relative_l2(pred, y, rows, len(indices), run.sharding.spatial_ranks, run.physical)
            else:
                weights = None if run.weights is None else run.weights[..., counted]
                loss = losses.squared_error(pred, y, weights, run.count // t_out * pred.shape[-1] * len(indices))
        with clock("backward"):
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            due = run.rank == 0 and time.monotonic() - run.last_checkpoint >= run.every_s
            flags = step_flags(loss, model, run.stop.received is not None, due)
        bad = [what for what in ("loss", "gradient norm") if flags[what]]
        if bad:
            trajectories = [run.train_set.trajectories[i] for i in indices]
            where = f"{at}, training trajectories {trajectories}"
            if run.config.on_nan == "stop":
                raise NonFiniteError(
                    f"non-finite {' and '.join(bad)} at {where}; stopped before the optimizer step "
                    f"(last checkpoint: {newest_checkpoint(run.out)}); --on-nan skip-batch skips such batches"
                )
            optimizer.zero_grad(set_to_none=True)
            sums.skipped += 1
        else:
            with clock("optimizer"):
                optimizer.step()
            sums.trained += len(indices)
            sums.total += float(loss.detach()) * len(indices)
    return flags


def _save_mid_epoch(run: Run, epoch: int, step: int, sums: EpochSums, stop: bool) -> None:
    """A checkpoint after step ``step`` of epoch ``epoch`` (from 0); then, if the ranks agreed to ``stop``,
    ``Stopped``."""
    with run.timeouts("checkpoint", f"epoch {epoch + 1}, step {step}"):
        record = run.meta(epoch, sums)
        path = save_checkpoint(run.out / "checkpoints", epoch + 1, run.model, run.optimizer, record, step=step)
    run.last_checkpoint = time.monotonic()
    if stop:
        raise _stopped(run.out, run.stop.received, path, epoch, step)


def _end_epoch(
    run: Run, bar: tqdm, epoch: int, sums: EpochSums, clock: PhaseClock, began: float
) -> tuple[PDEBenchMetrics | None, float]:
    """The end of epoch ``epoch`` (from 0): its training loss over every rank, the test pass, its metrics
    row and checkpoint, then ``Stopped`` if a signal came meanwhile. Returns the test relative L2 and, in
    the run's last epoch, PDEBench's metrics of the final model (else None): ``(pdebench, test_l2)``."""
    config, device = run.config, run.device
    if not sums.trained:
        raise NonFiniteError(f"epoch {epoch + 1}: every batch had a non-finite loss or gradient norm")
    train_loss = float(comm.all_reduce(torch.tensor(sums.total, dtype=torch.float64, device=device))) / sums.trained
    # The last epoch's test pass also gives PDEBench's metrics of the final model.
    final = pdebench_metrics(run.test_set, device) if epoch == config.epochs - 1 else None
    with clock("test"), run.timeouts("test", f"epoch {epoch + 1}, the test pass"):
        test_l2 = relative_l2(run.model, run.test_set, run.sharding, config.batch_size, device, final, config.prefetch)
    seconds = time.perf_counter() - began
    peak = comm.all_reduce_max(torch.tensor(float(peak_bytes(device)), dtype=torch.float64, device=device))
    row = dict(
        epoch=epoch + 1,
        train_loss=train_loss,
        test_rel_l2=test_l2,
        seconds=seconds,
        phase_seconds=clock.seconds,
        skipped_batches=sums.skipped,
        peak_memory_gib=float(peak) / 2**30,  # the most any rank has held since it started
    )
    run.history.append(row)
    with run.timeouts("checkpoint", f"epoch {epoch + 1}, its checkpoint"):
        path = save_checkpoint(run.out / "checkpoints", epoch + 1, run.model, run.optimizer, run.meta(epoch + 1))
    run.last_checkpoint = time.monotonic()
    if run.rank == 0:
        _report(run, bar, row)
    # A signal during the test pass or the write: stop now, on this epoch's checkpoint.
    if epoch + 1 < config.epochs and comm.all_reduce(torch.tensor(float(run.stop.received is not None), device=device)):
        raise _stopped(run.out, run.stop.received, path, epoch + 1, None)
    return final, test_l2


def _report(run: Run, bar: tqdm, row: dict) -> None:
    """Rank 0: an epoch's metrics row in ``metrics.jsonl``, on the progress bar and (unless ``--quiet``) a
    line on stdout, flushed at once for a log that a killed job leaves."""
    with open(run.out / "metrics.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    train_loss, test_l2, seconds = row["train_loss"], row["test_rel_l2"], row["seconds"]
    bar.set_postfix(loss=f"{train_loss:.4g}", test_l2=f"{test_l2:.4f}", s_per_epoch=f"{seconds:.1f}")
    if not run.config.quiet:
        bar.write(
            f"epoch {row['epoch']:3d}/{run.config.epochs}  loss {train_loss:.5f}  "
            f"test rel L2 {test_l2:.4f}  {seconds:5.1f} s"
        )
        sys.stdout.flush()


def _stopped(out: Path, received: str | None, path: Path, epoch: int, step: int | None) -> Stopped:
    """The ``Stopped`` of a run stopped at ``epoch`` (whole epochs done) and ``step`` of the next, with
    its checkpoint at ``path`` (call on every rank); rank 0 writes ``<out>/stopped.json``. ``received``
    is this rank's signal (None where only a peer received one)."""
    where = f"after epoch {epoch}" if step is None else f"at epoch {epoch + 1}, step {step}"
    signal = next(name for name in comm.all_gather_object(received) if name is not None)
    if comm.rank() == 0:
        record = dict(signal=signal, checkpoint=str(path), epoch=epoch, step=step)
        (out / STOPPED).write_text(json.dumps(record) + "\n")
    return Stopped(f"stopped by {signal} {where}: checkpoint {path}; continue with --resume")


def train_rank(config: TrainConfig) -> list[dict] | Stopped:
    """One rank of ``drift train`` (an entry point for ``drift.jobs.launch.run_ranks`` or torchrun): join the
    process group, make sure the data exist (rank 0 generates the default set), check, train. Returns
    the history, or the ``Stopped`` a signal ended the run with."""
    # Ranks drift started were checked where it started them, memory included (their own allocations would
    # shrink the machine's share they measure); ranks under torchrun check here, before the group forms when
    # the data exist: every rank refuses alike, none left waiting for a peer that already left.
    own_check = launched() and not pooled()
    early = own_check and config.data is not None
    # From the start: a scheduler's warning while the group forms or the data load still stops the run.
    with StopSignals() as stop:
        if early:
            check_config(config, int(os.environ["WORLD_SIZE"]), memory=True)
        with process_group(config.device), memory_watch(config):
            if config.data is None:
                if comm.rank() == 0:
                    ensure_default_data(False if config.quiet else config.progress, rank_device())
                comm.barrier()
                config = dataclasses.replace(config, data=str(default_data_path()))
            if not early:
                check_config(config, comm.world_size(), memory=own_check)
            try:
                return train(config, stop)
            except Stopped as stopped:
                return stopped


def memory_watch(config: TrainConfig) -> contextlib.AbstractContextManager:
    """What holds this rank to ``--memory-per-rank`` on the CPU (where it stands in for an accelerator's
    memory): a ``MemoryWatch`` under torchrun; nothing in the ranks drift's launcher starts, which it holds
    itself, nor on one process or a GPU."""
    if launched() and not pooled() and config.memory_per_rank is not None and config.device == "cpu":
        return MemoryWatch(round(config.memory_per_rank * 2**30))
    return contextlib.nullcontext()
