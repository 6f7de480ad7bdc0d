#!/usr/bin/env bash
# The one-launch ring decode step (RingDecodeConfig.cuda_fused) on the GPU in one device call, from the repository
# root with .gpucarry/ carried (as lab/scripts/gpu_serving_protocol.sh):
#   BUDGET=120 bash lab/scripts/gpu_onelaunch.sh
# 1. builds the CUDA passes of DEFAULT_BUILD plain and with the one-launch kernel (register budgets 4 and 3), in
#    parallel, into /tmp/rrcache, while the carry installs (a cached build is not rebuilt); the ptxas register /
#    spill lines of the one-launch build go to $OUT/ptxas.log;
# 2. pytest tests/test_ring_decode_cuda.py -q -x (the one launch against the fp64 recurrence and bit for bit
#    against the two passes);
# 3. the serving-protocol bench, GDN and KDA, B = 64 256 512, arms ours_fp32 ours_fp32_fused sglang_packed_fp32
#    (then ours_fp32_fused3 if time is left), via lab/scripts/gpu_serving_protocol.sh with what is left of BUDGET.
# Returns under $OUT: build.log, ptxas.log, pytest.log, and gpu_serving_protocol.sh's files (serving_protocol.json /
# .md, bench.log, setup.log, caches.tar.xz).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
OUT=${OUT:-out/onelaunch}; mkdir -p "$OUT"; export OUT
BUDGET=${BUDGET:-120}; C=.gpucarry; S=/tmp/site
command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH=$PATH:/usr/local/cuda/bin; }
export SGLANG_REPLAYSSM_CUDA_CACHE=/tmp/rrcache PYTHONUNBUFFERED=1
mkdir -p /tmp/rrcache && cp -r $C/cuda/. /tmp/rrcache/ 2>/dev/null
PIDS=()
for n in 0 4 3; do
  PYTHONPATH=$PWD python3 -c "
import sys, time
from sglang_replayssm.kernels import ring_decode_cuda as r
mb, fmb, st, fst, bk, fbk = r.DEFAULT_BUILD
t = time.monotonic()
so = r.build(None, mb, flush_min_blocks=fmb, stages=st, flush_stages=fst, bulk=bk, flush_bulk=fbk, fused=$n)
print(f'fused=$n: {so.name} in {time.monotonic() - t:.1f}s')
" > $OUT/build_$n.log 2>&1 &
  PIDS+=($!)
done
# the ptxas lines of the fused build (an extra compile, to a throwaway object, not waited for by the tests)
nvcc -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 -shared -Xcompiler -fPIC -DRR_MIN_BLOCKS=4 \
  -DRR_FLUSH_MIN_BLOCKS=1 -DRR_STAGES=3 -DRR_FLUSH_STAGES=3 -DRR_FUSED=1 -DRR_FUSED_MIN_BLOCKS=4 -Xptxas -v \
  sglang_replayssm/kernels/csrc/ring_read.cu -o /tmp/ptxas_fused4.so > $OUT/ptxas.log 2>&1 &
PTX=$!
if [ ! -f $S/.carry-installed ]; then
  { C=$C S=$S . lab/gpu_serve/install_carry.sh; echo "[$(el)s] installed the carry"; } > $OUT/setup_carry.log 2>&1
fi
wait "${PIDS[@]}"
cat $OUT/build_*.log | tee $OUT/build.log; echo "[$(el)s] built"
export PYTHONPATH=$S:$PWD TRITON_CACHE_DIR=/tmp/triton SGLANG_JIT_CACHE_DIR=/tmp/jit TVM_FFI_DISABLE_TORCH_C_DLPACK=1
LEFT=$(( BUDGET - $(el) - 40 )); [ $LEFT -lt 30 ] && LEFT=30
timeout $LEFT python3 -m pytest tests/test_ring_decode_cuda.py -q -x -p no:cacheprovider 2>&1 \
  | tail -25 | tee $OUT/pytest.log
echo "[$(el)s] tests done"
BUDGET=$(( BUDGET - $(el) )) bash lab/scripts/gpu_serving_protocol.sh --models gdn kda --batches 64 256 512 \
  --arms ours_fp32 ours_fp32_fused sglang_packed_fp32 ours_fp32_fused3 --samples 10 --no-single --no-kda-cuda
wait $PTX; echo "[$(el)s] all done"
