import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import drift
from drift.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: drift "), out
    for command in ("info", "generate", "train", "evaluate", "predict", "export", "bench"):
        assert re.search(rf"^    {command}  +\S", out, re.MULTILINE), (command, out)  # listed with its help


def test_info_reports_versions(capsys):
    assert main(["info"]) == 0
    lines = capsys.readouterr().out.splitlines()
    backends = [b for b in ("gloo", "nccl", "mpi") if getattr(dist, f"is_{b}_available")()]
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    assert lines == [
        f"drift {drift.__version__}",
        f"python {platform.python_version()}, torch {torch.__version__}, {torch.get_num_threads()} threads",
        f"torch.distributed backends: {', '.join(backends)}",
        f"cuda devices: {', '.join(gpus) or 'none'}",
    ]
    assert "gloo" in backends


@pytest.mark.parametrize(
    ("script", "nproc"),
    [
        ("truncated_fft.py", 1),
        ("truncated_fft.py", 3),
        ("distributed_fft.py", 1),
        ("distributed_fft.py", 4),
        ("fno.py", 1),
        ("fno.py", 4),
    ],
)
def test_readme_examples_run(script, nproc):
    path = str(ROOT / "examples" / script)
    cmd = [sys.executable, path] if nproc == 1 else [sys.executable, "-m", "torch.distributed.run"]
    if nproc > 1:
        cmd += ["--standalone", "--nproc-per-node", str(nproc), path]  # a free port, not the fixed 29500
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    errors = [float(line.rsplit("error ", 1)[1].split()[0]) for line in done.stdout.splitlines() if "error " in line]
    assert errors and all(e < 1e-12 for e in errors), done.stdout
    assert done.stdout.startswith(f"P={nproc} ")


def test_truncated_benchmark_runs_at_a_tiny_size(tmp_path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "truncated_vs_fft.py"), "--shape", "16", "12", "10", "6"]
    cmd += ["--channels", "2", "--modes", "2", "2", "3", "2", "--repeats", "1", "--out", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["mode_shape"] == [4, 4, 6, 2]
    assert result["relative_error_forward"] < 2e-6 and result["relative_error_inverse"] < 2e-6
    # The report's figures are those of its measured times: the speedups are the FFT path's median time over
    # drift's, the rates drift's FLOPs over its time; the field is 2 x 16 x 12 x 10 x 6 float32 values.
    seconds = result["seconds"]
    assert set(seconds) == {"drift_forward", "fft_forward", "drift_inverse", "fft_inverse"}
    for phase in ("forward", "inverse"):
        speedup = seconds[f"fft_{phase}"] / seconds[f"drift_{phase}"]
        assert result[f"{phase}_speedup"] == speedup
        assert result[f"drift_{phase}_gflops"] == pytest.approx(result["plan_gflop"] / seconds[f"drift_{phase}"])
        line = f"{phase:10s} {seconds[f'drift_{phase}'] * 1e3:7.0f}ms {seconds[f'fft_{phase}'] * 1e3:7.0f}ms"
        assert f"{line} {speedup:7.2f}x" in done.stdout.splitlines(), done.stdout
    assert result["field_gb"] == 2 * 16 * 12 * 10 * 6 * 4 / 1e9
