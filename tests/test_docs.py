"""The documentation site builds with warnings as errors, and its API reference names the key objects."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("sphinx", reason="the docs need the test extra's sphinx")
pytest.importorskip("myst_parser", reason="the docs need the test extra's myst-parser")


def test_docs_build_without_warnings_and_name_the_api(tmp_path):
    out = tmp_path / "html"
    cmd = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html", "docs", str(out)]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, f"sphinx failed:\n{result.stdout}\n{result.stderr}"
    api = (out / "api.html").read_text(encoding="utf-8")
    for name in (
        "drift.TruncatedFFT",
        "drift.DistributedFFT",
        "drift.Layout",
        "drift.nn.parallelize",
        "drift.nn.FNO",
        "drift.nn.SpectralConv",
        "drift.cost.Machine",
        "drift.checkpoint_reader.CheckpointReader",
        "drift.data.Trajectories",
    ):
        assert f'id="{name}"' in api, f"the API page does not document {name}"
    # The reference opens with the transforms, layouts, parallelize and the models; instrumentation after.
    order = [api.index(f'id="{name}"') for name in ("drift.TruncatedFFT", "drift.Layout", "drift.Collective")]
    assert order == sorted(order), order
    order = [api.index(f'id="{name}"') for name in ("drift.nn.parallelize", "drift.nn.FNO", "drift.nn.ChannelMLP")]
    assert order == sorted(order), order
    for page in ("TRAINING", "PYTORCH", "TRANSFORMS", "FNO", "PDEBENCH", "PERFORMANCE", "BENCHMARKS", "GLOSSARY"):
        assert (out / f"{page}.html").is_file(), f"docs/{page}.md is not in the site"
    # The front page holds the quickstart, from the README: install, the demo, a first example.
    front = re.sub(r"<[^>]+>", "", (out / "index.html").read_text(encoding="utf-8"))
    for text in ("pip install -e", "drift train --nproc 4", "parallelize(model, mesh"):
        assert text in front, f"the front page lacks the quickstart's {text!r}"
    # The benchmarks: one page per topic, each in the site and linked from the index.
    pages = sorted(path.stem for path in (ROOT / "docs" / "benchmarks").glob("*.md"))
    assert pages == [
        "capacity",
        "clusters",
        "data",
        "gpu",
        "layers",
        "models",
        "problems",
        "transforms",
        "turbulence",
    ], pages
    index = (out / "BENCHMARKS.html").read_text(encoding="utf-8")
    for page in pages:
        assert (out / "benchmarks" / f"{page}.html").is_file(), f"docs/benchmarks/{page}.md is not in the site"
        assert f'href="benchmarks/{page}.html"' in index, f"docs/BENCHMARKS.md does not link to {page}.md"


def test_the_benchmarks_index_stays_an_index():
    assert len((ROOT / "docs" / "BENCHMARKS.md").read_text().splitlines()) <= 600
