#!/usr/bin/env bash
# The record rebuild's GPU checks in one call (issue 12): tests/test_rebuild_gpu.py (SGLang's conv,
# gates and chunk kernels, loaded by path from .devcarry, vs the fp64 oracle), then the timing table
# over record counts 1..255 at B=64 (tests.support.rebuild_bench, JSON in $OUT/rebuild.json).
# Extra arguments go to the bench. .devcarry/ must hold the files of
# tests.support.sglang_prefill_kernels.PREFILL_FILES (notes/kernels.md: how it is made).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD SGLANG_REPLAYSSM_SGLANG_ROOT=$PWD/.devcarry
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; \
  python3 -c 'import torch, triton, sys; print(sys.version, torch.__version__, triton.__version__)'; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout ${TEST_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider -rs -s tests/test_rebuild_gpu.py 2>&1 | tee "$OUT/pytest_rebuild.log" | tail -40
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 lab/scripts/bench_rebuild.py --sglang-root .devcarry --json "$OUT/rebuild.json" "$@" 2>&1 \
    | tee "$OUT/bench_rebuild.log" | tail -110
fi
