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
