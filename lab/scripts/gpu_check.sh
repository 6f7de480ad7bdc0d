#!/usr/bin/env bash
# Kernel checks on the lent GPU box, in one call: GPU tests of the ring decode kernels, the
# device cursor and materialize, then lab/scripts/bench_kernels.py (table + JSON). Logs go to $OUT
# (the device tool's return folder) or out/gpu. Extra arguments go to bench_kernels.py. The
# package is imported from this tree (PYTHONPATH), the GPU box having no install of it.
#
# Needs, carried in .devcarry/ (ignored by git; see notes/kernels.md for how it is made):
#   apache_tvm_ffi-*.whl                 tvm_ffi for the CUDA KDA packed baseline
#   sglang/kernels/...                   SGLang 0.5.23's kernel files (loaded by path)
#   kda_build/kda_packed_decode_8_1.so   optional prebuilt CUDA baseline (rebuilt if it fails to load)
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-out/gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .devcarry/*.whl \
  && export PYTHONPATH=/tmp/site:$PWD || export PYTHONPATH=$PWD
mkdir -p /tmp/kda_packed_build && cp .devcarry/kda_build/*.so /tmp/kda_packed_build/ 2>/dev/null
{ nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv; \
  python3 -c 'import torch, triton, sys; print(sys.version, torch.__version__, triton.__version__)'; } >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests/test_ring_decode_triton.py tests/test_cursor.py \
    tests/test_ring_decode_cuda.py tests/test_radix_kernel_binding.py tests/test_materialize.py \
    2>&1 | tee "$OUT/pytest.log" | tail -30
fi
if [ "${SKIP_BENCH:-0}" != 1 ]; then
  python3 lab/scripts/bench_kernels.py --sglang-root .devcarry --out "$OUT" "$@" 2>&1 | tee "$OUT/bench.log" | tail -60
fi
