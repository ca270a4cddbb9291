"""Starting ranks: joining the process group torchrun describes, or starting local ranks ourselves.

``run_ranks(fn, args, nproc)`` starts ``nproc`` local ranks through torch's elastic launcher (the
machinery behind torchrun, rendezvous on 127.0.0.1) and calls ``fn(*args)`` in each; with
``nproc == 1`` it calls ``fn`` in this process, with no process group. Inside a rank,
``with process_group(device):`` joins the default group the environment torchrun or the launcher set
(Gloo for CPU, NCCL for CUDA), picks this rank's device and leaves the group at the end.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import uuid
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from drift import comm
from drift.errors import PlanError

TIMEOUT = datetime.timedelta(minutes=30)  # generous: rank 0 may write the default data set first


class RankError(RuntimeError):
    """A rank of a launched group failed; the message names the rank and its error."""


def launched() -> bool:
    """Whether this process is one rank of a torchrun (or ``run_ranks``) group."""
    return "WORLD_SIZE" in os.environ and "RANK" in os.environ


def cores() -> int:
    """CPU cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def threads_per_rank(local_ranks: int) -> int:
    """Threads for each of ``local_ranks`` ranks on this machine: ``OMP_NUM_THREADS`` when it is set
    (to one number), else the cores shared among the ranks."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdecimal() and int(value) > 0:
        return int(value)
    return max(1, cores() // local_ranks)


@contextlib.contextmanager
def process_group(device: str = "cpu") -> Iterator[torch.device]:
    """Inside the block this process is in the group the environment describes (if any: alone
    otherwise); yields this rank's device and leaves the group at the end.

    Sets this process's thread count to ``threads_per_rank(local ranks)``. On CUDA, local rank r takes
    GPU ``r % GPUs``: each rank's own GPU where ranks see all of the machine's, the one GPU it sees where
    a scheduler shows each rank only its own.
    """
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if device == "cuda":
        if torch.cuda.device_count() < 1:
            raise PlanError("--device cuda: no CUDA device is available")
        where = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(where)
    else:
        where = torch.device("cpu")
    torch.set_num_threads(threads_per_rank(int(os.environ.get("LOCAL_WORLD_SIZE", 1))))
    if launched() and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if where.type == "cuda" else "gloo", timeout=TIMEOUT)
    try:
        yield where
    finally:
        comm.destroy_process_group()


def run_ranks(fn: Callable, args: tuple, nproc: int) -> list:
    """``[fn(*args) on rank r for r in range(nproc)]``, each rank a fresh local process (``nproc > 1``).

    ``fn`` must be importable (a module-level function). If a rank fails, the launcher stops the others
    and ``RankError`` carries the first failure's message.
    """
    if nproc == 1:
        return [fn(*args)]
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    config = LaunchConfig(
        min_nodes=1,
        max_nodes=1,
        nproc_per_node=nproc,
        run_id=str(uuid.uuid4()),
        rdzv_backend="c10d",
        rdzv_endpoint="127.0.0.1:0",
        max_restarts=0,
        monitor_interval=0.1,
        start_method="spawn",
    )
    try:
        results = elastic_launch(config, fn)(*args)
    except ChildFailedError as exc:
        rank, failure = exc.get_first_failure()
        raise RankError(f"rank {rank} failed (exit code {failure.exitcode})") from None
    return [results[r] for r in range(nproc)]
