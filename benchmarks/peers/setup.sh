#!/usr/bin/env bash
# Set up an isolated environment for the mpi4py-fft (FFTW + MPI) peer baseline.
# This is benchmark-only tooling; drift never depends on any of it.
# Idempotent: safe to re-run.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
VENV="${HERE}/.venv"
PYTHON="${PYTHON:-python3}"
# Versions measured in README.md (2026-12-02); override to try others,
# e.g. MPI4PY_FFT_SPEC=mpi4py-fft NUMPY_SPEC=numpy bash setup.sh
NUMPY_SPEC="${NUMPY_SPEC:-numpy==2.4.6}"
CYTHON_SPEC="${CYTHON_SPEC:-cython==3.3.1}"
MPI4PY_SPEC="${MPI4PY_SPEC:-mpi4py==4.1.2}"
MPI4PY_FFT_SPEC="${MPI4PY_FFT_SPEC:-mpi4py-fft==2.0.6}"

# 1. System packages: OpenMPI + FFTW (double/single/long-double headers and libs),
#    plus a compiler toolchain and pkg-config for the C extensions.
APT_PKGS=(openmpi-bin libopenmpi-dev libfftw3-dev build-essential pkg-config)
missing=()
for p in "${APT_PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
    SUDO=""
    [[ $(id -u) -ne 0 ]] && SUDO="sudo"
    echo "[setup] installing: ${missing[*]}"
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
else
    echo "[setup] system packages already installed"
fi

# 2. Separate virtual environment (never the project's own environment).
if [[ ! -x "${VENV}/bin/python" ]]; then
    echo "[setup] creating venv at ${VENV}"
    "$PYTHON" -m venv "$VENV"
    "${VENV}/bin/python" -m pip install -q --upgrade pip setuptools wheel
fi

# 3. Python packages. mpi4py compiles against the MPI found via mpicc;
#    mpi4py-fft compiles Cython wrappers against FFTW and locates the
#    headers/libraries through FFTW_ROOT (Debian puts them in /usr).
export MPICC="${MPICC:-mpicc}"
export FFTW_ROOT="${FFTW_ROOT:-/usr}"
export FFTW_INCLUDE_DIR="${FFTW_INCLUDE_DIR:-/usr/include}"
export FFTW_LIBRARY_DIR="${FFTW_LIBRARY_DIR:-/usr/lib/$(gcc -dumpmachine)}"

if "${VENV}/bin/python" -c "import mpi4py_fft, mpi4py, numpy" 2>/dev/null; then
    echo "[setup] numpy, mpi4py, mpi4py-fft already installed"
else
    # numpy + cython first: mpi4py-fft is built without build isolation so its
    # extension is compiled against the numpy that is actually in the venv.
    "${VENV}/bin/python" -m pip install -q "$NUMPY_SPEC" "$CYTHON_SPEC"
    # Build mpi4py from source so it links Debian's libmpi (found via $MPICC).
    "${VENV}/bin/python" -m pip install -q --no-binary mpi4py "$MPI4PY_SPEC"
    "${VENV}/bin/python" -m pip install -q --no-build-isolation "$MPI4PY_FFT_SPEC"
fi

"${VENV}/bin/python" - <<'PY'
import numpy, mpi4py, mpi4py_fft
from mpi4py import MPI
print("[setup] numpy", numpy.__version__, "| mpi4py", mpi4py.__version__,
      "| mpi4py-fft", mpi4py_fft.__version__, "|", MPI.Get_library_version().replace("\x00", "").splitlines()[0].strip())
PY
