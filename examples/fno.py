"""A neuraloperator-style FNO built on one device, parallelized over a DeviceMesh, run on DTensors.

Run on 1 process:        python examples/fno.py
Run on 4 Gloo ranks:     torchrun --nproc-per-node 4 examples/fno.py
"""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor

from drift.nn import FNO, parallelize

if "RANK" in os.environ:
    dist.init_process_group("gloo")
size = dist.get_world_size() if dist.is_initialized() else 1

# Built like neuraloperator's FNO: no grid, no global shape; the resolution comes from the input.
torch.manual_seed(0)  # every rank draws the same parameters
model = FNO(in_channels=3, out_channels=1, width=16, modes=(6, 6, 4), n_layers=4, dtype=torch.float64)
single = FNO(3, 1, 16, (6, 6, 4), n_layers=4, dtype=torch.float64)
single.load_state_dict(model.state_dict())  # a single-device twin to compare against

x = torch.randn(2, 3, 24, 20, 16, dtype=torch.float64)  # (batch, channels, x, y, z), the same on every rank
if size > 1:
    mesh = init_device_mesh("cpu", (size,))
    placements = (Shard(2),)  # x split over the ranks: a slab
    parallelize(model, mesh, placements)  # spectral weights become DTensors sharded over the mesh
    x_in = distribute_tensor(x, mesh, placements)  # each rank keeps its block
else:
    x_in = x

y = model(x_in)  # a DTensor on several ranks, a plain tensor on one
y_full = y.full_tensor() if size > 1 else y
reference = single(x)
err = (y_full - reference).norm() / reference.norm()

# Zero-shot super-resolution: the same weights on a field twice as fine.
fine = torch.randn(1, 3, 48, 40, 32, dtype=torch.float64)
y_fine = model(distribute_tensor(fine, mesh, placements) if size > 1 else fine)
y_fine = y_fine.full_tensor() if size > 1 else y_fine
fine_reference = single(fine)
fine_err = (y_fine - fine_reference).norm() / fine_reference.norm()

# Mixed precision: pointwise layers in bfloat16, the spectral transforms in float32.
single.float()
with torch.autocast("cpu", dtype=torch.bfloat16):
    y_mixed = single(x.float())
mixed_diff = (y_mixed.double() - reference).norm() / reference.norm()

if not dist.is_initialized() or dist.get_rank() == 0:
    print(f"P={size} output {tuple(y_full.shape)}: relative error {err:.1e} against one device")
    print(f"super-resolution {tuple(y_fine.shape)}: relative error {fine_err:.1e} against one device")
    print(f"autocast bfloat16: {y_mixed.dtype}, {mixed_diff:.1e} from float64")
if dist.is_initialized():
    dist.destroy_process_group()
