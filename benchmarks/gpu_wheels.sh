#!/usr/bin/env bash
# The wheels benchmarks/gpu.py needs on the GPU machine, whose image has torch, numpy,
# safetensors, huggingface_hub, click and pathspec but not these, and no network:
#
#   bash benchmarks/gpu_wheels.sh [PYTHON_VERSION]     # e.g. 3.11 (default: this python's)
#   # there: pip install --no-index --find-links benchmarks/wheels -e . && python -m benchmarks.gpu
set -euo pipefail
cd "$(dirname "$0")"
version="${1:-$(python3 -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')}"
rm -rf wheels && mkdir wheels
python3 -m pip download --quiet --dest wheels --only-binary=:all: --python-version "$version" \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    blake3 zstandard sqlite-utils pytest
ls wheels
