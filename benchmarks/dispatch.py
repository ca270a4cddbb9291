"""Host-side dispatch of one FNO block: the aten calls and kernels a forward (and backward) issues.

On a GPU every operation is a kernel launch plus its dispatch on the host, whatever its size, so a block
at the sizes drift runs is bound by how many it issues (docs/BENCHMARKS.md, "On one H200 GPU"). This
script counts them on the CPU with ``torch.profiler``, for drift's block at the chunk sizes of each device
type: the CPU's (cache-sized chunks, a thread's piece of the projection) and a GPU's (``WORK_BYTES`` and
``CHUNK_BYTES`` for other devices, one piece). It prints and writes, per pass:

- ``aten calls``: every aten operator the dispatcher ran, views and nested calls included;
- ``operations``: the outermost aten calls, those Python issued;
- ``kernels``: those of the outermost calls that compute or copy (not views or allocations), about one
  kernel launch each on a GPU.

    python benchmarks/dispatch.py [--shape 64x64x32x30] [--width 20] [--method drift] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
from collections import Counter
from collections.abc import Iterator

import torch
from torch.profiler import profile

import drift.truncated
from drift.layout import Layout
from drift.nn import PointwiseLinear, SpectralConv, chunked, fno_block

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


def _count(fn) -> dict[str, int]:
    fn()  # resident buffers and plans made before the counted call
    with profile() as prof:
        fn()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    outer = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    kernels = Counter(e.name for e in outer if e.name not in _NO_KERNEL)
    return {"aten calls": len(aten), "operations": len(outer), "kernels": sum(kernels.values())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="64x64x32x30")
    parser.add_argument("--width", type=int, default=20)
    parser.add_argument("--modes", type=int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--method", default="drift")
    parser.add_argument("--json")
    args = parser.parse_args()
    shape = tuple(int(n) for n in args.shape.split("x"))
    torch.manual_seed(0)
    conv = SpectralConv(args.width, args.width, tuple(args.modes), method=args.method)
    linear = PointwiseLinear(args.width, args.width)
    block = functools.partial(fno_block, conv, linear, layout=Layout(shape))
    x = torch.randn(1, args.width, *shape)

    def forward() -> None:
        with torch.no_grad():
            block(x)

    def step() -> None:
        block(x.detach().requires_grad_(True)).sum().backward()

    rows = []
    for chunks, sizes in (("cpu", contextlib.nullcontext), ("other devices", _chunks_of_other_devices)):
        with sizes():
            for name, fn in (("forward", forward), ("forward + backward", step)):
                rows.append({"chunks": chunks, "pass": name, **_count(fn)})
    print(f"one {args.method} block, {args.shape}, width {args.width}, modes {tuple(args.modes)}")
    print(f"{'chunk sizes of':>15}  {'pass':>18}  {'aten calls':>10}  {'operations':>10}  {'kernels':>7}")
    for r in rows:
        print(f"{r['chunks']:>15}  {r['pass']:>18}  {r['aten calls']:>10}  {r['operations']:>10}  {r['kernels']:>7}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=2)


if __name__ == "__main__":
    main()
