#!/usr/bin/env bash
# The whole device check of #22 as one command, on a machine with a GPU and no network:
#
#   here:  bash benchmarks/gpu_wheels.sh 3.X        # the device image's Python version
#   there: bash benchmarks/gpu_run.sh [OUT_DIR]     # (device tool: carry benchmarks/wheels)
#   a dry run without a GPU: GPU_RUN_DEVICE=torch-cpu GPU_RUN_ARGS="--sizes 0.03 --hidden 256" bash benchmarks/gpu_run.sh /tmp/g
#
# Installs wvc and the wheels it lacks there (blake3, zstandard, sqlite-utils), builds the C
# kernels (the C path it is compared with), runs the device-path tests, then
# benchmarks/gpu.py (4 and 16 GB), writing gpu.json, gpu_profile.txt and the log to OUT_DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-${OUT:-benchmarks/results}}"
mkdir -p "$out"
export PYTHONUNBUFFERED=1
{
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv || true
    python3 -c 'import sys, torch; print(sys.version, torch.__version__, torch.cuda.is_available())'
    python3 -m pip install --quiet --no-index --find-links benchmarks/wheels blake3 zstandard sqlite-utils pytest
    python3 -m pip install --quiet --no-deps --no-build-isolation -e . || python3 setup.py build_ext --inplace
    python3 -c 'from wvc.codec import native; assert native.kernels is not None, "no C kernels: the C path would be numpy"'
    python3 -m pytest -q tests/test_device_path.py -p no:cacheprovider || true  # the cuda case runs there
    python3 -m benchmarks.gpu --device "${GPU_RUN_DEVICE:-cuda}" ${GPU_RUN_ARGS:---sizes 4 16} --out "$out/gpu.json"
} 2>&1 | tee "$out/gpu_run.log"
