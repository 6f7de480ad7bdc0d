#!/usr/bin/env bash
# The serving-protocol decode bench (lab/scripts/bench_serving_protocol.py) in one device call, from the
# repository root, with .gpucarry/ carried (lab/gpu_serve/carry.sh, then lab/scripts/vllm_carry.sh for
# .gpucarry/vllm_fla):
#   BUDGET=230 bash lab/scripts/gpu_serving_protocol.sh [bench args, e.g. --quick or --batches 256]
# BUDGET: seconds for the whole call (the carry's install included); the bench starts no arm after what is
# left of it minus a margin. Installs the carry as scripts/gpu_serve.sh does (lab/gpu_serve/install_carry.sh):
# SGLang's kernel files under /tmp/site (the bench loads them by path, --sglang-root), the prebuilt CUDA
# passes in /tmp/rrcache (SGLANG_REPLAYSSM_CUDA_CACHE). Returns under $OUT: serving_protocol.json / .md,
# bench.log, setup.log, caches.tar.xz (Triton and JIT caches, as scripts/gpu_serve.sh returns them).
set -uo pipefail
cd "$(dirname "$0")/../.."
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
OUT=${OUT:-out/serving-protocol}; mkdir -p "$OUT"
BUDGET=${BUDGET:-230}; C=.gpucarry; S=/tmp/site
if [ ! -f $S/.carry-installed ]; then  # installed already by an earlier check in this device call
{
. lab/gpu_serve/install_carry.sh
echo "[$(el)s] installed the carry"
} > $OUT/setup.log 2>&1
fi
command -v nvcc >/dev/null || { [ -x /usr/local/cuda/bin/nvcc ] && export PATH=$PATH:/usr/local/cuda/bin; }
export PYTHONPATH=$S:$PWD PYTHONUNBUFFERED=1 SGLANG_REPLAYSSM_CUDA_CACHE=/tmp/rrcache TRITON_CACHE_DIR=/tmp/triton \
  SGLANG_JIT_CACHE_DIR=/tmp/jit TVM_FFI_DISABLE_TORCH_C_DLPACK=1
{
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader
echo "nvcc: $(command -v nvcc || echo none); rrcache: $(ls /tmp/rrcache | tr '\n' ' ')"
} >> $OUT/setup.log 2>&1
cat $OUT/setup.log
python3 lab/scripts/bench_serving_protocol.py --sglang-root $S --vllm-carry $C/vllm_fla --kda-build-dir /tmp/kda_build \
  --out $OUT/serving_protocol --budget-s $(( BUDGET - $(el) - 20 )) "$@" 2>&1 | tee $OUT/bench.log
(cd /tmp && tar cf - $(ls -d triton jit 2>/dev/null) | xz -T0 -3 > $OUT/caches.tar.xz)
ls -la $OUT; echo "[$(el)s] done"
