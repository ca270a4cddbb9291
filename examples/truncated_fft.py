"""Retained Fourier modes of a field sharded over ranks, checked against torch.fft.

Run on 1 process:        python examples/truncated_fft.py
Run on 4 Gloo ranks:     torchrun --nproc-per-node 4 examples/truncated_fft.py
"""

import torch
import torch.distributed as dist

import drift

if "RANK" in __import__("os").environ:
    dist.init_process_group("gloo")
size = dist.get_world_size() if dist.is_initialized() else 1
rank = dist.get_rank() if dist.is_initialized() else 0

shape, grid = (64, 48, 30), (size, 1, 1)  # slab decomposition over the first dim
plan = drift.TruncatedFFT(shape, modes=(8, 8, 6), grid=grid, dtype=torch.float64)

torch.manual_seed(0)
x = torch.randn(2, *shape, dtype=torch.float64)  # the global field, here made on every rank
x_local = drift.scatter(x, grid)  # this rank's block: (2, 64/P, 48, 30)

with drift.comm_log() as log:
    xhat = plan.forward(x_local)  # (2, 16, 16, 6): the retained modes, on every rank
    share = plan.forward(x_local, out="sharded")  # (2, M_p): this rank's share of the flattened modes
    y_local = plan.inverse(share, inp="sharded")  # this rank's block of irfftn(zero-filled spectrum)

ref = torch.fft.rfftn(x, dim=(-3, -2, -1))[:, plan.modes[0]][:, :, plan.modes[1]][..., plan.modes[2]]
err = (xhat - ref).norm() / ref.norm()
y = drift.gather(y_local, shape, grid)
if rank == 0:
    print(f"P={size} order={plan.order} local FLOPs={plan.flops:.3g}, relative error {err:.1e}")
    print("collectives:", [(c.kind, c.bytes) for c in log.calls], "output", tuple(y.shape))
if dist.is_initialized():
    dist.destroy_process_group()
