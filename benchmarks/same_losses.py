"""A redesign keeps a run's numbers: ``drift train --nproc 4`` with its defaults (or the options given after
``--``) from the source tree of ``--before`` (extracted with ``git archive``) and from the working tree, one
after the other on this host, with the same thread count and data (``$DRIFT_CACHE``). Prints each epoch's
train loss from both in hex and says whether they are bit for bit equal, and the largest relative difference
of the final model's test metrics (``test_metrics.json``), which must stay within 2e-6.

    python benchmarks/same_losses.py --before bab9d58
    python benchmarks/same_losses.py --before bab9d58 -- --epochs 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _train(tree: Path, out: Path, options: list[str]) -> tuple[list[float], dict]:
    """Runs ``drift train --nproc 4`` from ``tree``'s sources into ``out``: its train losses and final metrics."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    argv = [sys.executable, "-m", "drift", "train", "--nproc", "4", "--out", str(out), "--no-plots", *options]
    subprocess.run(argv, env=env, check=True, stdout=subprocess.DEVNULL)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r["train_loss"] for r in rows], json.loads((out / "test_metrics.json").read_text())


def _numbers(tree, prefix: str = "") -> dict[str, float]:
    """Every number in a JSON tree, by its path."""
    if isinstance(tree, dict):
        return {k: v for key, value in tree.items() for k, v in _numbers(value, f"{prefix}{key}.").items()}
    if isinstance(tree, list):
        return {k: v for i, value in enumerate(tree) for k, v in _numbers(value, f"{prefix}{i}.").items()}
    return {prefix[:-1]: float(tree)} if isinstance(tree, int | float) and not isinstance(tree, bool) else {}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="the commit to compare with")
    parser.add_argument("options", nargs="*", help="drift train options after --")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        before = Path(tmp) / "before"
        before.mkdir()
        archive = subprocess.run(["git", "archive", args.before], cwd=ROOT, capture_output=True, check=True).stdout
        subprocess.run(["tar", "-x", "-C", before], input=archive, check=True)
        old_losses, old_metrics = _train(before, Path(tmp) / "run-before", args.options)
        new_losses, new_metrics = _train(ROOT, Path(tmp) / "run-after", args.options)
    print(f"{'epoch':>5}  {args.before + ' train loss':>26}  {'working tree':>26}")
    for epoch, (old, new) in enumerate(zip(old_losses, new_losses, strict=True), 1):
        print(f"{epoch:5d}  {old.hex():>26}  {new.hex():>26}")
    same = old_losses == new_losses
    old_numbers, new_numbers = _numbers(old_metrics), _numbers(new_metrics)
    differences = [abs(new_numbers[k] - v) / abs(v) for k, v in old_numbers.items() if v and k in new_numbers]
    worst = max(differences, default=0.0)
    print(f"train losses bit for bit: {same}; test metrics' largest relative difference {worst:.2e} (<= 2e-6)")
    return 0 if same and worst <= 2e-6 and old_numbers.keys() == new_numbers.keys() else 1


if __name__ == "__main__":
    sys.exit(main())
