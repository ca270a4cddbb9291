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


@pytest.mark.parametrize("nproc", [1, 3])
def test_readme_example_runs(nproc):
    script = str(ROOT / "examples" / "truncated_fft.py")
    if nproc == 1:
        cmd = [sys.executable, script]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), script]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"P={nproc} ")
    assert float(first.rsplit("=", 1)[1]) < 1e-12


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
