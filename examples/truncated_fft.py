"""Retained Fourier modes of a field sharded over ranks, checked against torch.fft.

Run on 1 process:        python examples/truncated_fft.py
Run on 4 Gloo ranks:     torchrun --nproc-per-node 4 examples/truncated_fft.py
"""

import os

import torch
import torch.distributed as dist

import drift

if "RANK" in os.environ:
    dist.init_process_group("gloo")
size = dist.get_world_size() if dist.is_initialized() else 1
rank = dist.get_rank() if dist.is_initialized() else 0

shape = (64, 48, 30)
mesh, placements = drift.grid_mesh((size, 1, 1))  # slab decomposition over the first dim (None, () on 1 process)
plan = drift.TruncatedFFT(shape, (8, 8, 6), mesh, placements, dtype=torch.float64)

torch.manual_seed(0)
x = torch.randn(2, *shape, dtype=torch.float64)  # the global field, here made on every rank
x_local = plan.layout.scatter(x)  # this rank's block: (2, ceil(64/P) or less, 48, 30)

with drift.comm_log() as log:
    xhat = plan.forward(x_local)  # (2, 16, 16, 6): the retained modes, on every rank
    share = plan.forward(x_local, sharded=True)  # (2, k1_loc, 16, 6): this rank's chunk of the first mode dim
    y_local = plan.inverse(share, sharded=True)  # this rank's block of irfftn(zero-filled spectrum)

ref = torch.fft.rfftn(x, dim=(-3, -2, -1))[:, plan.modes[0]][:, :, plan.modes[1]][..., plan.modes[2]]
err = (xhat - ref).norm() / ref.norm()
err_share = (share - ref[:, plan.share_slice()]).norm() / ref[:, plan.share_slice()].norm()
y = plan.layout.gather(y_local)
if rank == 0:
    print(f"P={size} order={plan.order} local FLOPs={plan.flops:.3g}, relative error {err:.1e}")
    print(f"sharded spectrum {tuple(share.shape)}, modes {plan.share_slice()} of dim 0: relative error {err_share:.1e}")
    print("collectives:", [(c.kind, c.bytes) for c in log.calls], "output", tuple(y.shape))
if dist.is_initialized():
    drift.comm.destroy_process_group()
