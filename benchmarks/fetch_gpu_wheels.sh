#!/usr/bin/env bash
# Downloads, on a machine with package-registry access, the wheels that the GPU machine's image
# lacks (Python 3.12, x86-64) into the git-ignored .whl/, for benchmarks/gpu_suite.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
rm -f .whl/*.whl  # Two versions of one wheel would fail the suite's install.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
    grain==0.2.18 array-record==0.8.6 ml-collections==1.1.0 tensorboardX==2.6.5 portpicker==1.6.0
ls -l .whl
