#!/usr/bin/env bash
# drift on a CUDA machine, in one go: the test suite's device cases on CUDA ranks, then single-GPU
# benchmarks and a short training run, within DRIFT_CHECK_BUDGET_S seconds in all (default 540: a device
# call lasts at most 600 s). Each step's limit is cut to what is left of the budget, a step with under 20 s
# left is skipped (and counts as failed), and results.tgz is rewritten after every step, so a run cut short
# keeps what it measured. Needs python3 with torch (CUDA), numpy, h5py, tqdm,
# matplotlib, pytest and scipy (what `pip install -e '.[test]'` brings, neuraloperator optional); drift
# runs from this checkout (no install).
#
#   bash benchmarks/gpu_check.sh [OUT]      # OUT: where the logs and results.tgz go (default results/gpu)
#
# The tests are the files whose cases run on DRIFT_TEST_DEVICE (they import the harness or take the ranks
# fixture); the others run on the CPU whatever it says, as they do in CI. Cases with more ranks than the
# machine has GPUs skip and say why (NCCL takes one GPU per rank); the default suite runs them on CPU
# ranks. DRIFT_CHECK_DEVICE=cpu runs the same steps on CPU ranks (a rehearsal on a machine without a GPU).
set -uo pipefail
out=$(realpath -m "${1:-results/gpu}")  # before the cd: relative to where it is called from
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
device=${DRIFT_CHECK_DEVICE:-cuda}
if [ "$device" = cuda ]; then
    ranks=$(python3 -c 'import torch; print(torch.cuda.device_count())')
else
    ranks=2
fi
if ! [[ $ranks =~ ^[1-9][0-9]*$ ]]; then
    echo "gpu_check: no CUDA device found (python3 says: ${ranks:-nothing})" >&2
    exit 2
fi
mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
status=0 budget=${DRIFT_CHECK_BUDGET_S:-540}
pack() {  # the results so far (no checkpoints)
    (cd "$work" && find . -name '*.json' -o -name '*.md' | tar -czf "$out/results.tgz" -T -)
}
step() {  # step SECONDS NAME COMMAND...: run it, log to $out/NAME.txt, remember a failure
    local limit=$1 name=$2 left=$(( budget - SECONDS - 15 ))  # 15 s for the KILL below and the packing
    shift 2
    if [ "$left" -lt 20 ]; then
        echo "== $name: SKIPPED, $(( budget - SECONDS )) s left of the ${budget} s budget"
        status=1
        return
    fi
    [ "$left" -lt "$limit" ] && limit=$left
    echo "== $name ($limit s at most): $*"
    # SIGINT at the limit, so that pytest still prints the failures so far; KILL 10 s later.
    timeout -s INT -k 10 "$limit" "$@" > "$out/$name.txt" 2>&1 || { echo "   FAILED (exit $?), see $name.txt"; status=1; }
    tail -n 3 "$out/$name.txt"
    pack
}

step 30 info python3 -m drift info
device_tests=$(grep -lE '^from harness import|^def test_\w*\(ranks\b' tests/test_*.py)
# With pytest-xdist (and pytest-timeout), 4 workers of a quarter of the cores each, and a stack trace for a
# case that hangs: on one H200 the cases took over 265 s in 4 workers (most skip, needing more GPUs).
parallel=() threads=$(nproc)
if python3 -c 'import xdist, pytest_timeout' 2>/dev/null; then
    parallel=(-n 4 --timeout 150) threads=$(( threads > 7 ? threads / 4 : 1 ))
fi
OMP_NUM_THREADS=$threads DRIFT_TEST_DEVICE=$device step 360 tests python3 -m pytest -q -rfEs --durations 15 \
    "${parallel[@]}" $device_tests
step 75 scaling python3 -m drift bench scaling --device "$device" --nproc $(printf '%s\n' 1 "$ranks" | sort -u) \
    --shape 64x64x32x30 --local 32x32x32x30 --out "$work/scaling"
step 45 modes python3 -m drift bench modes --device "$device" --nproc 1 --out "$work/modes"
step 45 phases python3 -m drift bench phases --device "$device" --nproc 1 --out "$work/phases"
# Kernels and host dispatch of one block against its wall time: what bounds a block on this GPU.
step 60 dispatch python3 benchmarks/dispatch.py --device "$device" --json "$work/dispatch.json"
# The same model compiled whole with CUDA graphs: what launch-bound blocks gain from torch.compile.
step 120 compiled python3 benchmarks/compiled.py --device "$device" --shape 64x64x32x30 --layers 1 \
    --mode reduce-overhead --rounds 5 --json "$work/compiled.json"
if [ "$ranks" -gt 1 ]; then
    step 60 comm python3 -m drift bench comm --device "$device" --nproc "$ranks" --fno-ranks "$ranks" \
        --out "$work/comm"
fi
step 90 train python3 -m drift train --device "$device" --nproc 1 --epochs 3 --out "$work/train"
# Reading 128^3 data for a GPU's steps: pinned batches read ahead, copies that do not block; the losses of
# the three ways of reading must agree bit for bit (the last line).
step 240 data python3 benchmarks/data.py --device "$device" --ranks 1 --trajectories 4 --rounds 3 \
    --json "$work/data.json"
echo "logs and results.tgz in $out ($SECONDS s)"
exit $status
