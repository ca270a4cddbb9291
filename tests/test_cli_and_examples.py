import os
import subprocess
import sys
from pathlib import Path

import pytest

from drift.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_help_lists_subcommands(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    assert "info" in capsys.readouterr().out


def test_info_reports_versions(capsys):
    assert main(["info"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("drift ") and "gloo" in out


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
    result = __import__("json").loads(out.read_text())
    assert result["mode_shape"] == [4, 4, 6, 2]
    assert result["relative_error_forward"] < 2e-6 and result["relative_error_inverse"] < 2e-6
    assert result["forward_speedup"] > 0 and "forward" in done.stdout
