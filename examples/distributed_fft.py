"""A sharded 3-D FFT on a pencil grid and a DCT-II on a slab, checked against torch.fft and scipy.

Run on 1 process:        python examples/distributed_fft.py
Run on 4 Gloo ranks:     torchrun --nproc-per-node 4 examples/distributed_fft.py
"""

import os

import scipy.fft
import torch
import torch.distributed as dist

import drift

if "RANK" in os.environ:
    dist.init_process_group("gloo")
size = dist.get_world_size() if dist.is_initialized() else 1
rank = dist.get_rank() if dist.is_initialized() else 0

# Real-to-complex 3-D FFT on a pencil grid: two of the three dims split, the last one whole.
shape = (64, 48, 40)
grid = (2, size // 2, 1) if size % 2 == 0 else (size, 1, 1)
fft = drift.DistributedFFT(shape, grid, kind="r2c", dtype=torch.float64)
torch.manual_seed(0)
x = torch.randn(3, *shape, dtype=torch.float64)  # the global field (here made on every rank)
y_local = fft.forward(drift.scatter(x, grid))  # this rank's block of rfftn(x): fft.output_slices(rank)
expected = torch.fft.rfftn(x, dim=(-3, -2, -1))[(..., *fft.output_slices(rank))]
err_fft = float((y_local - expected).norm() / expected.norm())
x_back = fft.inverse(y_local)  # this rank's input block again

# DCT-II (scipy's dctn type 2, orthonormal) on a slab grid.
dct = drift.DistributedFFT(shape, (size, 1, 1), kind="dct2", norm="ortho", dtype=torch.float64)
c_local = dct.forward(drift.scatter(x, (size, 1, 1)))
reference = torch.from_numpy(scipy.fft.dctn(x.numpy(), type=2, axes=(-3, -2, -1), norm="ortho"))
err_dct = float((c_local - reference[(..., *dct.output_slices(rank))]).norm() / c_local.norm())

if rank == 0:
    print(f"P={size} rfftn on grid {grid}: output block {fft.output_slices(rank)}, relative error {err_fft:.1e}")
    print(f"P={size} dctn on grid {(size, 1, 1)}: relative error {err_dct:.1e}")
if dist.is_initialized():
    dist.destroy_process_group()
