#!/usr/bin/env bash
# The read copy's GPU checks in one call: tests/test_read_copy_cuda.py (CUDA passes vs the torch
# reference and the fp64 oracle), then the serving-regime table
# (tests.support.read_copy_bench, JSON in $OUT/read_copy.json). Extra arguments go to
# the bench (e.g. --batches 64 256 512 --models gdn kda). .devcarry/ as for lab/scripts/gpu_check.sh;
# set SGLANG_REPLAYSSM_CUDA_CACHE=$PWD/.devcarry/cuda to use prebuilt .so files.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devcarry/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; \
  python3 -c 'import torch, triton, sys; print(sys.version, torch.__version__, triton.__version__)'; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rs -x tests/test_read_copy_cuda.py tests/test_read_copy_refresh.py 2>&1 | tee "$OUT/pytest.log" | tail -30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 lab/scripts/bench_read_copy.py gpu --sglang-root .devcarry --json "$OUT/read_copy.json" "$@" 2>&1 \
    | tee "$OUT/bench.log" | tail -40
fi
