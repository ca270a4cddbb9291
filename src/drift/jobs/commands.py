"""The ``drift`` command's jobs, each given its options as values and returning the exit code: what
``info``, ``generate``, ``train``, ``evaluate``, ``predict`` and ``export`` do once ``drift.cli`` has
parsed their command lines.

A job runs on the ranks it starts itself (``--nproc N``: ``drift.jobs.launch``'s rank pool; one rank runs
here unless it may need restarting) or, under torchrun, as one of torchrun's ranks. ``train`` also takes
the run folder's lock before any rank starts, restarts failed ranks (``--max-restarts``; a restarted job
resumes from the latest complete checkpoint), and reports failures as ``drift.jobs.reports`` says: one
``drift <command>: error: ...`` line (one per host under torchrun), exit code 2, every failed rank's
traceback in ``<out>/failure.log``. A run stopped by a signal exits with ``drift.jobs.stopping.EXIT_STOPPED``.
"""

from __future__ import annotations

import json
import os
import platform
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch

import drift
from drift import comm
from drift.jobs import reports

if TYPE_CHECKING:
    from drift.jobs.stopping import Stopped
    from drift.train import TrainConfig


def fail(command: str, message: str) -> int:
    """Print ``drift <command>: error: <message>`` on stderr; the exit code of a failed job, 2."""
    print(f"drift {command}: error: {message}", file=sys.stderr)
    return 2


def info() -> int:
    """``drift info``: versions, distributed backends and devices."""
    backends = comm.backends_available()
    cuda = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    print(f"drift {drift.__version__}")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"torch.distributed backends: {', '.join(backends) or 'none'}")
    print(f"cuda devices: {', '.join(cuda) or 'none'}")
    return 0


def generate(out: str, *, device: str, **options: Any) -> int:
    """``drift generate``: ``drift.data.generate(out, device=device, **options)``, then ``wrote <out>``."""
    from drift.data import generate as write_trajectories

    if device == "cuda" and torch.cuda.device_count() < 1:
        return fail("generate", "--device cuda: no CUDA device is available")
    try:
        write_trajectories(out, device=device, **options)
    except ValueError as exc:
        return fail("generate", str(exc))
    print(f"wrote {out}")
    return 0


def generate_layout(out: str, layout: str, **options: Any) -> int:
    """``drift generate --layout``: ``drift.data.write_synthetic(out, layout, **options)``, then ``wrote <out>``."""
    from drift.data import write_synthetic

    try:
        write_synthetic(out, layout, **options)
    except ValueError as exc:
        return fail("generate", str(exc))
    print(f"wrote {out}")
    return 0


def generate_ns2d(out: str, *, nproc: int, float32: bool, force: bool, **options: Any) -> int:
    """``drift generate --problem ns2d``: ``drift.data.ns2d.generate_ns2d`` on ``nproc`` local ranks (the
    grid split over them), then ``wrote <out>`` and what the solve did."""
    from drift.data.ns2d import check_arguments
    from drift.data.writer import OutputError
    from drift.jobs.launch import RankError

    if not force and os.path.exists(out):
        return fail("generate", f"--out {out} exists: pass --force to replace it")
    checked = ("samples", "resolution", "solve_resolution", "viscosity", "record_every", "frames", "dt", "cfl")
    checked += ("initial_resolution",)
    try:  # before any rank starts
        check_arguments(ranks=nproc, forcing=options["forcing"], **{name: options[name] for name in checked})
    except ValueError as exc:
        return fail("generate", str(exc))
    options |= dict(dtype=torch.float32 if float32 else torch.float64, replace=force)
    call = (_solve_ns2d, dict(path=out, device="cpu", options=options))
    try:
        attrs = _on_ranks(nproc, _in_group, call, "cpu")
    except (RankError, ValueError, FloatingPointError, OutputError) as exc:
        return fail("generate", str(exc))
    print(f"wrote {out}: {attrs['scheme']}, time step {attrs['time step']}")
    return 0


def _solve_ns2d(path: str, device: str, options: dict) -> dict:
    """One rank of ``generate_ns2d``: its attributes."""
    from drift.data.ns2d import generate_ns2d

    return generate_ns2d(path, **options)


def _on_ranks(
    nproc: int,
    fn: Callable[[Any], Any],
    arg: Any,
    device: str,
    pool: bool = False,
    rank_memory_bytes: int | None = None,
) -> Any:
    """Rank 0's ``fn(arg)``: called here for one rank (unless ``pool`` or ``rank_memory_bytes``), else on
    ``nproc`` fresh local ranks on ``device``, each held to ``rank_memory_bytes`` of private memory."""
    from drift.jobs.launch import run_ranks

    if nproc == 1 and not pool and rank_memory_bytes is None:
        return fn(arg)
    return run_ranks(nproc, fn, arg, device=device, rank_memory_bytes=rank_memory_bytes)[0]


def _train_restarting(config: TrainConfig, expected: tuple[type, ...]) -> list[dict] | Stopped:
    """``train_rank`` on fresh local ranks, started again up to ``config.max_restarts`` times after a
    failure other than one of drift's own ``expected`` errors (which a restart would repeat; a peer that
    stopped answering is worth a restart); a restarted job resumes from the latest complete checkpoint
    when there is one. Raises the last ``RankError``."""
    from drift.jobs.cluster import PeersLost
    from drift.jobs.launch import RankError
    from drift.train import restarted, train_rank

    restarts = config.max_restarts
    pool = restarts > 0  # one rank too runs in a process of its own, which may die
    # On the CPU --memory-per-rank stands in for an accelerator's memory: the ranks are held to it (a GPU
    # holds its own).
    held = None
    if config.memory_per_rank is not None and config.device == "cpu":
        held = round(config.memory_per_rank * 2**30)
    for attempt in range(1, restarts + 1):
        try:
            return _on_ranks(config.nproc, train_rank, config, config.device, pool, held)
        except RankError as exc:
            report = exc.reports.get(exc.first, "")
            if exc.first is None or (reports.raised(report, expected) and not reports.raised(report, (PeersLost,))):
                raise
            config = restarted(config)
            how = "resuming from the latest checkpoint" if config.resume else "from the start"
            print(f"drift train: {exc}; restart {attempt} of {restarts}, {how}", file=sys.stderr)
    return _on_ranks(config.nproc, train_rank, config, config.device, pool, held)


def _expected_errors() -> tuple[type, ...]:
    """drift's own errors of a training job: one line each, never restarted (a peer that stopped answering
    is, ``_train_restarting``)."""
    from drift.checkpoint import CheckpointError, CheckpointWriteError, FolderInUse
    from drift.data import DataError
    from drift.jobs.cluster import ClusterError, PeersLost
    from drift.train import ConfigError, NonFiniteError

    return (
        ConfigError,
        DataError,
        CheckpointError,
        CheckpointWriteError,
        FolderInUse,
        NonFiniteError,
        ClusterError,
        PeersLost,
    )


def train(config: TrainConfig, *, resume_auto: bool = False, nproc: int | None = None) -> int:
    """``drift train`` with the options ``config``: on ``config.nproc`` ranks started here, or as one rank
    under torchrun (``nproc``: ``--nproc`` as given, None when left out; torchrun's ranks then count).
    ``resume_auto``: ``--resume auto``, which resumes when ``--out`` holds a checkpoint of this run (as
    a requeued SLURM job does without it). The run records its data and test data as absolute paths."""
    from drift.jobs.launch import RankError, launched
    from drift.jobs.stopping import EXIT_STOPPED, Stopped
    from drift.train import ConfigError, restarted, resumed_data, slurm_requeued

    # The run records absolute paths, for drift evaluate from any folder; one file as itself, not a list.
    if config.data is not None:
        config.data = absolute(config.data)
    if config.test_data is not None:
        config.test_data = tuple(map(os.path.abspath, config.test_data))
    expected = _expected_errors()
    try:
        if resume_auto or (not config.resume and slurm_requeued()):
            config = restarted(config)  # resumes when --out holds a checkpoint that looks whole
        config = resumed_data(config)
        if launched():
            world = int(os.environ["WORLD_SIZE"])
            if nproc is not None and nproc != world:
                raise ConfigError(f"--nproc {nproc} under torchrun, which started {world} ranks")
            config.nproc = world
            if config.max_restarts:
                raise ConfigError("--max-restarts under torchrun: give it to torchrun (torchrun --max-restarts N)")
            history = _torchrun_rank(config, expected)
            if isinstance(history, int):
                return history
        else:
            history = _launch(config, expected)
    except RankError as exc:
        return fail("train", reports.rank_failure(exc, config.out, expected))
    except expected as exc:
        if launched() and not reports.first_on_host(str(exc)):
            return 2
        return fail("train", str(exc))
    if isinstance(history, Stopped):
        print(f"drift train: {history}", file=sys.stderr)
        return EXIT_STOPPED
    last = history[-1] if history else None
    if last is not None:
        print(f"done: {last['epoch']} epochs, test relative L2 {last['test_rel_l2']:.4f}; outputs in {config.out}")
    return 0


def _torchrun_rank(config: TrainConfig, expected: tuple[type, ...]) -> list[dict] | Stopped | int:
    """This torchrun rank of ``drift train``: its history or ``Stopped`` on rank 0; an exit code where
    this rank is done (another rank reports) or failed, its report printed and logged. drift's
    ``expected`` errors propagate, for one line per host."""
    from drift.jobs.cluster import ClusterError, PeersLost
    from drift.jobs.launch import restart_count
    from drift.jobs.stopping import EXIT_STOPPED, Stopped
    from drift.train import check_fresh_run, restarted, train_rank

    rank = int(os.environ["RANK"])
    if restart_count() > 0:  # torchrun restarted the job
        config = restarted(config)
    check_fresh_run(config)
    try:
        history = train_rank(config)  # checks the options on every rank, after the data exist
    except ClusterError as exc:  # every rank knows: one line a host
        if os.environ.get("LOCAL_RANK", "0") != "0":
            return 2
        leave = isinstance(exc, PeersLost) and reports.stranded()
        if not leave:
            return fail("train", str(exc))
        store = f"{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}"
        fail("train", f"{exc}; the job's store at {store} is out of reach too: this host leaves the job")
        reports.stop_agent()
        return 2
    except expected:
        raise
    except Exception:
        return fail("train", reports.own_failure(config.out, rank, restart_count()))
    if rank != 0:
        return EXIT_STOPPED if isinstance(history, Stopped) else 0
    return history


def _launch(config: TrainConfig, expected: tuple[type, ...]) -> list[dict] | Stopped:
    """``drift train`` on ranks started here: the options checked (the default data generated first when
    no ``--data``), the run folder checked free before any rank starts, an earlier job's failure log
    removed, then the ranks, restarted as ``--max-restarts`` allows."""
    from drift.checkpoint import check_unlocked
    from drift.train import check_config, check_fresh_run, ensure_default_data

    if config.data is None:
        check_config(config, config.nproc)  # the options, before minutes of generating on the device
        config.data = str(ensure_default_data(False if config.quiet else config.progress, config.device))
        if config.device == "cuda":  # the ranks' memory, not this launcher's cache
            torch.cuda.empty_cache()
    check_config(config, config.nproc)
    check_fresh_run(config)
    check_unlocked(config.out)  # rank 0 takes the lock; this refuses before any rank starts
    reports.forget_failure(config.out)
    return _train_restarting(config, expected)


def absolute(paths: str | Sequence[str]) -> str | tuple[str, ...]:
    """Data files and folders (one path, or several) as absolute paths: one as a string, several as a
    tuple."""
    full = tuple(os.path.abspath(p) for p in ((paths,) if isinstance(paths, str) else paths))
    return full[0] if len(full) == 1 else full


def _test_set(result: dict) -> str:
    """Which test set ``evaluate``'s ``result`` is of, in a few words."""
    if result["split"] == "test-data":
        files = result["test_files"]
        return f"--test-data {files[0]}" + (f" and {len(files) - 1} more files" if len(files) > 1 else "")
    return f"{result['split']} split"


def _in_group(call: tuple[Callable[..., Any], dict]) -> Any:
    """``fn(**kwargs)`` of ``call = (fn, kwargs)`` inside this rank's process group on ``kwargs["device"]``."""
    from drift.jobs.launch import process_group

    fn, kwargs = call
    with process_group(kwargs["device"]):
        return fn(**kwargs)


def evaluate(*, nproc: int | None = None, json_path: str | None = None, **options: Any) -> int:
    """``drift evaluate``: ``drift.train.evaluate(**options)`` on ``nproc`` ranks started here (default
    one), or on torchrun's; rank 0 prints the test relative L2 and PDEBench's metrics, and writes the
    result to ``json_path`` if given. ``options``' data and test data are made absolute paths."""
    from drift.checkpoint import CheckpointError
    from drift.data import DataError
    from drift.jobs.launch import RankError, launched
    from drift.train import ConfigError, find_checkpoint, format_pdebench
    from drift.train import evaluate as evaluate_on_ranks

    if options.get("data"):
        options["data"] = absolute(options["data"])
    if options.get("test_data"):
        options["test_data"] = tuple(map(os.path.abspath, options["test_data"]))
    call = (evaluate_on_ranks, options)
    try:
        find_checkpoint(options["checkpoint"])  # no whole checkpoint: fails here, before any rank starts
        result = _in_group(call) if launched() else _on_ranks(nproc or 1, _in_group, call, options["device"])
    except (ConfigError, DataError, CheckpointError, RankError, ValueError) as exc:
        return fail("evaluate", str(exc))
    if not launched() or int(os.environ.get("RANK", 0)) == 0:
        print(
            f"test relative L2 {result['test_rel_l2']:.4f} over {result['test_trajectories']} trajectories "
            f"at {'x'.join(map(str, result['resolution']))} ({result['method']} on {result['ranks']} ranks; epoch "
            f"{result['epoch']} checkpoint from {result['trained_on']} ranks at "
            f"{'x'.join(map(str, result['trained_resolution']))}; {_test_set(result)})"
        )
        print(f"PDEBench metrics (physical units): {format_pdebench(result['pdebench'])}")
        if json_path:
            with open(json_path, "w") as f:
                json.dump(result, f, indent=2)
    return 0


def predict(*, nproc: int | None = None, **options: Any) -> int:
    """``drift predict``: ``drift.predict.predict(**options)`` on ``nproc`` ranks started here (default
    one), or on torchrun's, its inputs and output checked before any rank starts; rank 0 says what it
    wrote."""
    from drift.checkpoint import CheckpointError
    from drift.data.writer import OutputError
    from drift.jobs.launch import RankError, launched
    from drift.predict import check_prediction_memory, plan_prediction
    from drift.predict import predict as predict_on_ranks

    rank = int(os.environ.get("RANK", 0)) if launched() else 0
    run = {name: options.pop(name) for name in ("device", "batch_size", "progress", "activations")}
    try:
        if run["device"] == "cuda" and torch.cuda.device_count() < 1:
            raise ValueError("--device cuda: no CUDA device is available")
        ranks = int(os.environ["WORLD_SIZE"]) if launched() else nproc or 1
        plan = plan_prediction(**options, world_size=ranks)  # the inputs and the output, before any rank starts
        check_prediction_memory(plan, ranks, run["device"], run["batch_size"], run["activations"])
        call = (predict_on_ranks, options | run)
        result = _in_group(call) if launched() else _on_ranks(ranks, _in_group, call, run["device"])
    except (ValueError, CheckpointError, OutputError, RankError) as exc:
        return 2 if rank != 0 else fail("predict", str(exc))
    if rank == 0:
        print(
            f"wrote {result['out']}: {result['trajectories']} trajectories of {result['t_in']} input + "
            f"{result['t_out']} predicted frames at {'x'.join(map(str, result['resolution']))}, by "
            f"{result['checkpoint']} (epoch {result['epoch']}) on {result['ranks']} rank(s)"
        )
    return 0


def export(checkpoint: str, out: str, *, kind: str, force: bool) -> int:
    """``drift export``: the model of ``checkpoint`` written to ``out`` in the format ``kind`` (one of
    ``drift.export.EXPORTERS``), replacing an existing ``out`` if ``force``."""
    from drift.checkpoint import CheckpointError
    from drift.export import EXPORTERS, ExportError

    try:
        path = EXPORTERS[kind](checkpoint, out, force=force)
    except (ValueError, CheckpointError, ExportError) as exc:
        return fail("export", str(exc))
    print(f"wrote {path}")
    return 0
