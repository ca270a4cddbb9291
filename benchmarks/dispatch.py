"""Host-side dispatch of one FNO block: the aten calls and kernels a forward (and backward) issues.

On a GPU every operation is a kernel launch plus its dispatch on the host, whatever its size, so a block
at the sizes drift runs is bound by how many it issues (docs/benchmarks/gpu.md, "On one H200 GPU"). This
script counts them with ``torch.profiler``. On the CPU it runs drift's block at the chunk sizes of each
device type: the CPU's (cache-sized chunks, a thread's piece of the projection) and a GPU's
(``WORK_BYTES`` and ``CHUNK_BYTES`` for other devices, one piece); with ``--device cuda``, at that
device's own. It prints and writes, per pass:

- ``aten calls``: every aten operator the dispatcher ran, views and nested calls included;
- ``operations``: the outermost aten calls, those Python issued;
- ``kernels``: those of the outermost calls that compute or copy (not views or allocations), about one
  kernel launch each on a GPU;
- on CUDA, ``device kernels`` and ``device ms``: what the GPU ran (kernels, copies) and for how long;
- ``wall ms``: the median of ``--repeats`` calls, between device synchronisations. Against ``device ms``
  it says how much of a pass the host's launches and dispatch take.

    python benchmarks/dispatch.py [--shape 64x64x32x30] [--width 20] [--device cuda] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import statistics
import time
from collections import Counter
from collections.abc import Iterator

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

import drift.truncated
from drift.arguments import shape as shape_arg
from drift.layout import Layout
from drift.nn import PointwiseLinear, SpectralConv, chunked, fno_block
from drift.profiling import synchronize_device

# Operators that only make views, shapes or empty tensors: no kernel on a GPU.
_NO_KERNEL = {
    f"aten::{name}"
    for name in [
        *("alias", "as_strided", "contiguous", "detach", "empty", "empty_like", "empty_strided", "expand"),
        *("imag", "lift_fresh", "mT", "narrow", "permute", "real", "reshape", "resolve_conj", "resolve_neg"),
        *("result_type", "select", "set_", "slice", "squeeze", "t", "transpose", "unsqueeze", "view"),
        *("view_as", "view_as_complex", "view_as_real", "_reshape_alias", "_unsafe_view"),
    ]
}


@contextlib.contextmanager
def _chunks_of_other_devices() -> Iterator[None]:
    """The CPU runs with the chunk sizes of other devices inside the block."""
    saved = (
        drift.truncated.WORK_BYTES["cpu"],
        chunked.CHUNK_BYTES["cpu"],
        chunked._parts,
        chunked._thread_chunk_bytes,
    )
    drift.truncated.WORK_BYTES["cpu"] = drift.truncated.OTHER_DEVICES_WORK_BYTES
    chunked.CHUNK_BYTES["cpu"] = chunked.OTHER_DEVICES_CHUNK_BYTES
    chunked._parts, chunked._thread_chunk_bytes = (lambda device: 1), (lambda device: None)
    try:
        yield
    finally:
        drift.truncated.WORK_BYTES["cpu"], chunked.CHUNK_BYTES["cpu"] = saved[:2]
        chunked._parts, chunked._thread_chunk_bytes = saved[2:]


def _measure(fn, device: torch.device, repeats: int) -> dict[str, float]:
    """Counts of one call of ``fn`` (after a first, untimed one), its median wall time over ``repeats``
    calls, and on CUDA the kernels (and copies) the device ran and their summed time."""
    fn()  # resident buffers and plans made before the counted call
    cuda = device.type == "cuda"
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        fn()
        synchronize_device()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    outer = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = Counter(e.name for e in outer if e.name not in _NO_KERNEL)
    row = {"aten calls": len(aten), "operations": len(outer), "kernels": sum(kernels.values())}
    if cuda:
        ran = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        row["device kernels"] = len(ran)
        row["device ms"] = sum(e.time_range.elapsed_us() for e in ran) / 1e3
    walls = []
    for _ in range(repeats):
        synchronize_device()
        began = time.perf_counter()
        fn()
        synchronize_device()
        walls.append(time.perf_counter() - began)
    row["wall ms"] = statistics.median(walls) * 1e3
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=shape_arg, default=shape_arg("64x64x32x30"))
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--modes", type=int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--method", default="drift")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = args.shape
    shape_text = "x".join(map(str, shape))
    device = torch.device(args.device)
    torch.manual_seed(0)
    conv = SpectralConv(args.width, args.width, tuple(args.modes), method=args.method, device=device)
    linear = PointwiseLinear(args.width, args.width, device=device)
    block = functools.partial(fno_block, conv, linear, layout=Layout(shape))
    x = torch.randn(1, args.width, *shape, device=device)

    def forward() -> None:
        with torch.no_grad():
            block(x)

    def step() -> None:
        block(x.detach().requires_grad_(True)).sum().backward()

    # On the CPU both chunk sizes (those of other devices as a proxy for a GPU's dispatch); elsewhere its own.
    sizes = {"cpu": contextlib.nullcontext, "other devices": _chunks_of_other_devices}
    if device.type != "cpu":
        sizes = {device.type: contextlib.nullcontext}
    rows = []
    for chunks, context in sizes.items():
        with context():
            for name, fn in (("forward", forward), ("forward + backward", step)):
                rows.append({"chunks": chunks, "pass": name, **_measure(fn, device, args.repeats)})
    print(f"one {args.method} block, {shape_text}, width {args.width}, modes {tuple(args.modes)}, on {device}")
    columns = [c for c in rows[0] if c not in ("chunks", "pass")]
    print(f"{'chunk sizes of':>15}  {'pass':>18}  " + "  ".join(f"{c:>14}" for c in columns))
    for r in rows:
        values = "  ".join(f"{r[c]:>14.3f}" if isinstance(r[c], float) else f"{r[c]:>14}" for c in columns)
        print(f"{r['chunks']:>15}  {r['pass']:>18}  {values}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
