#!/usr/bin/env bash
# A session's first device call, everything in one (a second call may never start): the CUDA tests of the latest
# kernel changes, the B=64 launch sweep (ring, then read copy; notes/kernels.md, "B=64 launch sweep"), then the
# serve check's KL on qnext-gdn with whatever time is left. From the repository root, .gpucarry/ carried
# (lab/gpu_serve/carry.sh, then lab/scripts/ring_sweep_carry.sh):
#   OUT=$OUT bash lab/scripts/first_call.sh
# Each step has its own time limit so that a slow one cannot take the ones after it; the serve check gets the
# rest of END_S (default 585 s from the start). Writes under $OUT: pytest.log, ring_configs.json,
# copy_configs.json, tables.md, serve_check.json, logs.tar.xz, caches.tar.xz, setup.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
OUT=${OUT:-out/first-call}; mkdir -p "$OUT"; END_S=${END_S:-585}
TESTS=${TESTS:-"tests/test_kernel_variants_cuda.py tests/test_cursor.py tests/test_materialize.py"}
OUT=$OUT TESTS="$TESTS" TESTS_S=${TESTS_S:-90} CHECK=none bash scripts/gpu_serve.sh > $OUT/tests.out 2>&1
tail -30 $OUT/tests.out; echo "[$(el)s] tests done"
SWEEP=(env PATH=$PATH:/usr/local/cuda/bin PYTHONPATH=/tmp/site:$PWD SGLANG_REPLAYSSM_CUDA_CACHE=/tmp/rrcache
       TRITON_CACHE_DIR=/tmp/triton python3 lab/scripts/bench_ring_configs.py --sglang-root /tmp/site --batches 64)
timeout -s INT -k 10 ${RING_S:-140} "${SWEEP[@]}" --config w1=warps:1 --config v2=vsplit:2 \
  --config v2w1=vsplit:2,warps:1 --config b43w1=warps:1,stages:4,bulk:1 --config b43w1u4=warps:1,stages:4,bulk:1,fused:4 \
  --config b43w1two=warps:1,stages:4,bulk:1,fused:0 --rounds 3 --budget-s $(( ${RING_S:-140} - 40 )) \
  --out $OUT/ring_configs 2>&1 | tail -40
echo "[$(el)s] ring sweep done"
timeout -s INT -k 10 ${COPY_S:-100} "${SWEEP[@]}" --no-ring --copy-config bf=fmt:bf16 \
  --copy-config bfw1=fmt:bf16,read_warps:1 --copy-config bfd3w1=fmt:bf16,depth:3,read_warps:1 \
  --copy-config bfp8=fmt:bf16,flush_parts:8 --copy-config f8=fmt:fp8 --copy-config f8w1=fmt:fp8,read_warps:1 \
  --rounds 3 --budget-s $(( ${COPY_S:-100} - 35 )) --out $OUT/copy_configs 2>&1 | tail -30
echo "[$(el)s] copy sweep done"
LEFT=$(( END_S - $(el) ))
if [ $LEFT -gt 150 ]; then
  OUT=$OUT MODEL=${MODEL:-qnext-gdn} BUDGET=$LEFT bash scripts/gpu_serve.sh --arms ${ARMS:-plugin} \
    --stages ${STAGES:-kl --kl-arms plugin} 2>&1 | tail -60
else
  echo "[$(el)s] no serve check: $LEFT s left"
fi
echo "[$(el)s] first call done"
