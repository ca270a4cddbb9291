"""A sharded 3-D FFT on a pencil mesh and a DCT-II on a slab, checked against torch.fft and scipy.

The pencil transform takes and returns DTensors; the slab one takes this rank's block as a plain tensor.

Run on 1 process:        python examples/distributed_fft.py
Run on 4 Gloo ranks:     torchrun --nproc-per-node 4 examples/distributed_fft.py
"""

import os

import scipy.fft
import torch
import torch.distributed as dist
from torch.distributed.tensor import distribute_tensor

import drift
from drift.layout import shift_placements

if "RANK" in os.environ:
    dist.init_process_group("gloo")
size = dist.get_world_size() if dist.is_initialized() else 1
rank = dist.get_rank() if dist.is_initialized() else 0

torch.manual_seed(0)
shape = (64, 48, 40)
x = torch.randn(3, *shape, dtype=torch.float64)  # the global field (here made on every rank)

# Real-to-complex 3-D FFT on a pencil mesh: two of the three dims split, the last one whole.
grid = (2, size // 2, 1) if size % 2 == 0 else (size, 1, 1)
mesh, placements = drift.grid_mesh(grid)
fft = drift.DistributedFFT(shape, mesh, placements, kind="r2c", dtype=torch.float64)
expected = torch.fft.rfftn(x, dim=(-3, -2, -1))
if mesh is None:  # one process: plain tensors
    y = fft.forward(x)
    x_back = fft.inverse(y)
    err_fft, err_back = [float((a - b).norm() / b.norm()) for a, b in ((y, expected), (x_back, x))]
else:  # DTensors of the global field (its batch dim first) in and out
    # The field's placements with its batch dim in front; each rank keeps its own block (no scatter).
    x_dtensor = distribute_tensor(x, mesh, shift_placements(fft.layout.placements, 1), src_data_rank=None)
    y = fft.forward(x_dtensor)  # a DTensor of rfftn(x), placed as fft.output_placements say
    x_back = fft.inverse(y)
    err_fft = float((y.full_tensor() - expected).norm() / expected.norm())
    err_back = float((x_back.full_tensor() - x).norm() / x.norm())

# DCT-II (scipy's dctn type 2, orthonormal) on a slab mesh, on this rank's block.
slab, slab_placements = drift.grid_mesh((size, 1, 1))
dct = drift.DistributedFFT(shape, slab, slab_placements, kind="dct2", norm="ortho", dtype=torch.float64)
c_local = dct.forward(dct.layout.scatter(x))  # this rank's block of the output: dct.output_slices()
reference = torch.from_numpy(scipy.fft.dctn(x.numpy(), type=2, axes=(-3, -2, -1), norm="ortho"))
err_dct = float((c_local - reference[(..., *dct.output_slices())]).norm() / c_local.norm())

if rank == 0:
    print(f"P={size} rfftn on grid {grid}: output block {fft.output_slices()}, relative error {err_fft:.1e}")
    print(f"P={size} irfftn back to the field: relative error {err_back:.1e}")
    print(f"P={size} dctn on grid {(size, 1, 1)}: relative error {err_dct:.1e}")
if dist.is_initialized():
    drift.comm.destroy_process_group()
