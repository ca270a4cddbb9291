"""TruncatedFFT against the FFT path (rfftn + truncation, zero-fill + irfftn), side by side in one process.

Default: the DRIFT paper's 3D+time grid 128 x 128 x 64 x 30 with 20 channels and modes (8, 8, 8, 16),
float32. The two paths' passes are interleaved (so both see the same machine state), in an order reversed
every other repeat; drift's are also timed back to back. Prints the time ratios, the plan's FLOPs and the
achieved rates against this machine's measured float32 matmul rate and memory bandwidth, and writes JSON.

    python benchmarks/truncated_vs_fft.py [--shape 128 128 64 30] [--channels 20] [--modes 8 8 8 16]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import time
from pathlib import Path

import torch

import drift


def _median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def matmul_rate(n: int = 4096, repeats: int = 3) -> float:
    """Measured float32 gemm rate, GFLOP/s."""
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    return 2 * n**3 / _median_time(lambda: a @ b, repeats) / 1e9


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 3) -> float:
    """Measured memory bandwidth of a large tensor copy (bytes read + written), GB/s."""
    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    dst.copy_(src)
    return 2 * nbytes / _median_time(lambda: dst.copy_(src), repeats) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", type=int, nargs="+", default=[128, 128, 64, 30])
    parser.add_argument("--channels", type=int, default=20)
    parser.add_argument("--modes", type=int, nargs="+", default=[8, 8, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("results/truncated_vs_fft.json"))
    args = parser.parse_args()
    shape, modes = tuple(args.shape), tuple(args.modes)
    d = len(shape)
    dims = tuple(range(-d, 0))

    plan = drift.TruncatedFFT(shape, modes, dtype=torch.float32)
    kept = [torch.tensor(m) for m in plan.modes]
    index = torch.meshgrid(*kept, indexing="ij")
    half = (*shape[:-1], shape[-1] // 2 + 1)

    def fft_forward(x):
        return torch.fft.rfftn(x, dim=dims)[(..., *index)]

    def fft_inverse(xhat):
        full = xhat.new_zeros(*xhat.shape[:-d], *half)
        full[(..., *index)] = xhat
        return torch.fft.irfftn(full, s=shape, dim=dims)

    torch.manual_seed(0)
    x = torch.randn(args.channels, *shape)
    with torch.inference_mode():
        xhat = plan.forward(x)
        ref = fft_forward(x)
        err_forward = float((xhat - ref).norm() / ref.norm())
        err_inverse = float((plan.inverse(ref) - fft_inverse(ref)).norm() / fft_inverse(ref).norm())
        times = {"drift_forward": [], "fft_forward": [], "drift_inverse": [], "fft_inverse": []}
        passes = {
            "drift_forward": lambda: plan.forward(x),
            "fft_forward": lambda: fft_forward(x),
            "drift_inverse": lambda: plan.inverse(xhat),
            "fft_inverse": lambda: fft_inverse(xhat),
        }
        # Interleaved, so both paths see the same machine state, in an order alternated every repeat: the
        # pass right after the FFT path's inverse (13 GB page-faulted) ran 1.1-1.4x slower (drift's forward).
        for repeat in range(args.repeats):
            order = list(passes) if repeat % 2 == 0 else list(reversed(passes))
            for name in order:
                times[name].append(_median_time(passes[name], 1))
        # The same passes again back to back: each after itself, not after the FFT path's 5 GB of temporaries.
        back_to_back = {
            "drift_forward": _median_time(lambda: plan.forward(x), args.repeats),
            "drift_inverse": _median_time(lambda: plan.inverse(xhat), args.repeats),
        }
    median = {k: statistics.median(v) for k, v in times.items()}
    gemm, bandwidth = matmul_rate(), copy_bandwidth()

    flops = plan.flops * args.channels
    field_bytes = x.numel() * x.element_size()
    fft_flops = 2.5 * x.numel() * math.log2(math.prod(shape))  # the classic 5/2 N log2 N of a real FFT
    result = {
        "shape": shape,
        "channels": args.channels,
        "modes": modes,
        "mode_shape": plan.mode_shape,
        "order": plan.order,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "seconds": median,
        "seconds_back_to_back": back_to_back,
        "forward_speedup": median["fft_forward"] / median["drift_forward"],
        "inverse_speedup": median["fft_inverse"] / median["drift_inverse"],
        "plan_gflop": flops / 1e9,
        "fft_gflop_estimate": fft_flops / 1e9,
        "drift_forward_gflops": flops / median["drift_forward"] / 1e9,
        "drift_inverse_gflops": flops / median["drift_inverse"] / 1e9,
        "matmul_gflops": gemm,
        "copy_gbps": bandwidth,
        "field_gb": field_bytes / 1e9,
        "relative_error_forward": err_forward,
        "relative_error_inverse": err_inverse,
    }
    print(
        f"grid {'x'.join(map(str, shape))}, {args.channels} channels, modes {modes}, float32, "
        f"{torch.get_num_threads()} threads, contraction order {plan.order}"
    )
    print(f"{'':10s} {'drift':>9s} {'FFT path':>9s} {'speedup':>8s}")
    for phase in ("forward", "inverse"):
        a, b = median[f"drift_{phase}"], median[f"fft_{phase}"]
        print(f"{phase:10s} {a * 1e3:7.0f}ms {b * 1e3:7.0f}ms {b / a:7.2f}x")
    print(
        f"drift back to back (each pass after itself): forward {back_to_back['drift_forward'] * 1e3:.0f} ms, "
        f"inverse {back_to_back['drift_inverse'] * 1e3:.0f} ms"
    )
    print(
        f"plan: {flops / 1e9:.1f} GFLOP per pass (FFT estimate {fft_flops / 1e9:.1f}); "
        f"forward {result['drift_forward_gflops']:.0f} GFLOP/s, "
        f"inverse {result['drift_inverse_gflops']:.0f} GFLOP/s of a {gemm:.0f} GFLOP/s float32 matmul"
    )
    print(
        f"field {field_bytes / 1e9:.2f} GB: reading it once at the measured {bandwidth:.1f} GB/s copy rate "
        f"takes {field_bytes / bandwidth / 1e6:.0f} ms"
    )
    print(f"relative error drift vs FFT path: forward {err_forward:.1e}, inverse {err_inverse:.1e}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
