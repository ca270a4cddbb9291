#!/usr/bin/env bash
# drift on a CUDA machine, in one go (under 9 minutes; far less on one H200): the test suite on CUDA
# ranks, then single-GPU benchmarks and a short training run. Needs python3 with torch (CUDA), numpy,
# h5py, tqdm, matplotlib, pytest and scipy (what `pip install -e '.[test]'` brings, neuraloperator
# optional); drift runs from this checkout (no install).
#
#   bash benchmarks/gpu_check.sh [OUT]      # OUT: where the logs and results.tgz go (default results/gpu)
#
# Test cases with more ranks than the machine has GPUs skip and say why (NCCL takes one GPU per rank);
# the default suite runs them on CPU ranks. DRIFT_CHECK_DEVICE=cpu runs the same steps on CPU ranks
# (a rehearsal of the script on a machine without a GPU).
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
status=0
step() {  # step SECONDS NAME COMMAND...: run it, log to $out/NAME.txt, remember a failure
    local limit=$1 name=$2
    shift 2
    echo "== $name: $*"
    timeout "$limit" "$@" > "$out/$name.txt" 2>&1 || { echo "   FAILED (exit $?), see $name.txt"; status=1; }
    tail -n 3 "$out/$name.txt"
}

step 30 info python3 -m drift info
DRIFT_TEST_DEVICE=$device step 200 tests python3 -m pytest -q -rs tests
step 60 scaling python3 -m drift bench scaling --device "$device" --nproc $(printf '%s\n' 1 "$ranks" | sort -u) \
    --forward-only --shape 64x64x32x30 --local 32x32x32x30 --out "$work/scaling"
step 45 modes python3 -m drift bench modes --device "$device" --nproc 1 --out "$work/modes"
step 45 phases python3 -m drift bench phases --device "$device" --nproc 1 --out "$work/phases"
if [ "$ranks" -gt 1 ]; then
    step 60 comm python3 -m drift bench comm --device "$device" --nproc "$ranks" --fno-ranks "$ranks" \
        --out "$work/comm"
fi
step 90 train python3 -m drift train --device "$device" --nproc 1 --epochs 3 --out "$work/train"
tar -czf "$out/results.tgz" -C "$work" .
echo "logs and results.tgz in $out"
exit $status
