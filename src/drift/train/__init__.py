"""Training and evaluating a distributed 3D+time FNO on PDEBench-layout compressible Navier-Stokes data.

The problem: from ``t_in`` frames of the five fields predict the next ``t_out`` frames. The FNO works
on the 4-D grid ``(x, y, z, t)`` with ``t_out`` time points: its input channels are the ``fields x t_in``
input frames, repeated along t, and the normalised time ``t / t_out``; its output channels are the
fields at each of the ``t_out`` times.

The ranks form a device mesh (``Sharding``): ``data_parallel`` ranks along a "data" mesh dim (when
above 1), each taking its ``torch.chunk`` share of every batch's trajectories, times the spatial ranks
of ``grid`` (default: a slab along x), one mesh dim per split spatial dim ("x", "y", "z"); time is never
split. Each rank reads, computes and stores only its block of its trajectories. The model is built on
one device from ``torch.manual_seed(seed)`` and then parallelized over the mesh (it takes and returns
DTensors), so the same seed gives the same run on any number of ranks and any mesh.

Model: neuraloperator 2.0's FNO options (``--model neuralop``, ``FNO.neuralop_defaults``) or Li et al.'s
plain FNO (``--model plain``). Optimizer: AdamW with ``--weight-decay`` (Adam at 0; ``drift.optim``'s
fused step), its learning rate ``--lr`` constant or cosine-annealed to 0 over the run's optimizer steps
(``--schedule``).

Loss: the mean squared error over the global batch (each rank's loss is its share of the sum, so
their sum is the global loss, torch.distributed's convention; drift sums the gradients over the mesh
itself), by default (``--loss frame-weighted``) each field and predicted frame weighted by the inverse
of its variance over the training trajectories (``frame_weights``), or unweighted (``--loss mse``).
Test metric: the relative L2 error ``||pred - true|| / ||true||`` of each test trajectory over its whole
normalised field (every field, time and point), averaged over the trajectories; after the last epoch and
in ``evaluate`` also PDEBench's metrics (``drift.metrics``) on the physical fields.
The data: one file or several read as one (``--data``, ``drift.data.PDEBenchFiles``; the run records
the files in order). The test set is the last 10% of each file's trajectories (``split="last"``) or
PDEBench's first 10% (``split="pdebench"``), or every trajectory of separate files (``--test-data``); the
run records it, and a resumed run or an evaluation uses the same. Each step's batch is read in a
background thread during the step before (``--no-prefetch``: inside the step), with the same results.

Guards: rank 0 holds the run folder's lock for the whole run (``drift.checkpoint.folder_lock``); every
step all-reduces one flag for a non-finite loss or gradient norm on any rank, and before the optimizer
step (so before any checkpoint could hold the result) the run stops with ``NonFiniteError`` naming the
epoch, step and trajectories, or (``on_nan="skip-batch"``) skips the batch and counts it.

The package, one idea a module (each imports only those above it):

- ``config``: the options (``TrainConfig``), the choices some take, the default data set.
- ``resume``: a run folder's checkpoints, the options a checkpoint pins, resuming, restarts, the lock.
- ``checks``: ``check_config`` and its parts, the spatial grid of ranks and the reduction mesh.
- ``sharding``: the mesh and placements (``Sharding``), batches, the global sum, the data sets, the
  frame weights.
- ``model``: the FNO and its optimizer. ``schedule``: the learning rate.
- ``trained``: a checkpoint's model loaded on this job's ranks, for a data grid at a resolution.
- ``evaluation``: relative L2, PDEBench's metrics, ``evaluate``. ``plots``: the plots.
- ``epoch``: an epoch's phase clock, step flags and running sums. ``run``: a run set up on a rank.
- ``loop``: ``train`` and ``train_rank``.

The names below are re-exported from their modules; a test that replaces one the loop calls patches the
module that calls it (``drift.train.loop.save_checkpoint``), except ``train_rank``, which ``drift train``
looks up here when it starts its ranks.
"""

from drift.data import model_input, model_target
from drift.train.checks import (
    check_config,
    check_reduction,
    check_resolution,
    check_split,
    reduction_shape,
    spatial_grid,
)
from drift.train.config import (
    DEFAULT_DATA,
    HOSTS,
    LEGACY_OPTIONS,
    LOSSES,
    META_KEYS,
    MODEL_OPTIONS,
    MODELS,
    ON_NAN,
    OPTIMIZER_OPTIONS,
    SCHEDULES,
    ConfigError,
    TrainConfig,
    config_from,
    default_data_path,
    ensure_default_data,
)
from drift.train.epoch import PhaseClock
from drift.train.evaluation import (
    TEST_METRICS,
    evaluate,
    format_pdebench,
    pdebench_metrics,
    relative_l2,
)
from drift.train.loop import NonFiniteError, train, train_rank
from drift.train.model import build_model, fno_options, make_optimizer
from drift.train.resume import (
    check_fresh_run,
    find_checkpoint,
    restarted,
    resume_point,
    resumed_data,
    saved_config,
    slurm_requeued,
)
from drift.train.schedule import learning_rate, set_learning_rate
from drift.train.sharding import Sharding, frame_weights
from drift.train.trained import Trained, data_grid, load_trained, resolution_stride, trained_config

__all__ = [
    "ConfigError",
    "DEFAULT_DATA",
    "HOSTS",
    "LEGACY_OPTIONS",
    "LOSSES",
    "META_KEYS",
    "MODELS",
    "MODEL_OPTIONS",
    "NonFiniteError",
    "ON_NAN",
    "OPTIMIZER_OPTIONS",
    "PhaseClock",
    "SCHEDULES",
    "Sharding",
    "TEST_METRICS",
    "TrainConfig",
    "Trained",
    "build_model",
    "check_config",
    "check_fresh_run",
    "check_reduction",
    "check_resolution",
    "check_split",
    "config_from",
    "data_grid",
    "default_data_path",
    "ensure_default_data",
    "evaluate",
    "find_checkpoint",
    "fno_options",
    "format_pdebench",
    "frame_weights",
    "learning_rate",
    "load_trained",
    "make_optimizer",
    "model_input",
    "model_target",
    "pdebench_metrics",
    "reduction_shape",
    "relative_l2",
    "resolution_stride",
    "restarted",
    "resume_point",
    "resumed_data",
    "saved_config",
    "set_learning_rate",
    "slurm_requeued",
    "spatial_grid",
    "train",
    "train_rank",
    "trained_config",
]
