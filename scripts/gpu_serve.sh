#!/usr/bin/env bash
# The GPU serving check in one device call, from the repository root, with .gpucarry/ carried (built
# here by lab/gpu_serve/carry.sh):
#   bash scripts/gpu_serve.sh [serve_check.py args, e.g. --arms baseline,plugin --stages main,kl]
#   CHECK=decode_ab bash scripts/gpu_serve.sh [decode_ab.py args]   (decode side by side, servers up at once)
#   TESTS="tests/a.py tests/b.py" bash scripts/gpu_serve.sh ...   (those tests first, on the GPU, at most
#   TESTS_S seconds, default 180, then interrupted so that pytest still reports; pytest.log under $OUT);
#   CHECK=none: the tests alone (no model, no server)
# Installs SGLang 0.5.23 and its missing dependencies from the carry into /tmp/site, this tree as the
# plugin (its entry points through a dist-info), builds the model ($MODEL, default qnext-gdn) with
# `make-models`, then runs lab/gpu_serve/serve_check.py: real `python -m sglang.launch_server`
# processes with the plugin, CUDA graphs and the overlap scheduler on (SGLang's defaults).
# The lab machine's torch 2.11 cannot load the real sgl_kernel nor SGLang's Rust radix-tree core: the
# lab switch SGLANG_REPLAYSSM_LAB_GPU=1 with lab/gpu_serve/shim on PYTHONPATH routes sgl_kernel to the
# torch stand-in, and SGLang's own Python tree core is chosen. A user's install takes neither.
# Returns under $OUT: tables.md, serve_check.json, logs.tar.xz (server logs, bench JSONs), caches.tar.xz
# (Triton / JIT caches: copy it to .gpucarry/ for the next call), setup.log.
set -uo pipefail
cd "$(dirname "$0")/.."
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
OUT=${OUT:-out/gpu-serve}; mkdir -p "$OUT"; W=/tmp/serve_out; rm -rf $W; mkdir -p $W /tmp/ops
BUDGET=${BUDGET:-570}; MODEL=${MODEL:-qnext-gdn}; C=.gpucarry; S=/tmp/site
# A warm machine may still run servers of a call that its time limit cut short (they hold GPU memory): stop them.
pkill -9 -f "[l]aunch_server" 2>/dev/null; pkill -9 -f "[s]glang::" 2>/dev/null; true
# A second check in the same device call finds the carry installed (the marker) and the model built.
if [ ! -f $S/.carry-installed ]; then
{
. lab/gpu_serve/install_carry.sh
echo "[$(el)s] installed the carry"
} > $OUT/setup.log 2>&1
fi
export PYTHONPATH=$S:$PWD:$PWD/lab/gpu_serve/shim:$PWD/lab/gpu_serve/stubs PATH=$S/bin:$PATH
export SGLANG_REPLAYSSM_LAB_GPU=1 SGLANG_REPLAYSSM_LAB_OPS_LOG=/tmp/ops/ops SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK=1 \
  SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND=python SGLANG_FORCE_FUSED_OP_BACKEND=torch TVM_FFI_DISABLE_TORCH_C_DLPACK=1 \
  HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 SGLANG_JIT_CACHE_DIR=/tmp/jit TRITON_CACHE_DIR=/tmp/triton \
  SGLANG_REPLAYSSM_CUDA_CACHE=/tmp/rrcache LAB_COMPILE_LOG=$W/compiles/triton
mkdir -p $W/compiles
{
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
python3 -c "import sys, torch, triton, sglang; print(sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'sglang', sglang.__version__)"
[ "${CHECK:-}" = none ] || [ -f /tmp/models/$MODEL/config.json ] || python3 -m sglang_replayssm.cli make-models --out /tmp/models --names $MODEL
echo "[$(el)s] model $MODEL built"
} >> $OUT/setup.log 2>&1
cat $OUT/setup.log
if [ -n "${TESTS:-}" ]; then
  timeout -s INT -k 20 ${TESTS_S:-180} python3 -m pytest -q -p no:cacheprovider -rfEs $TESTS 2>&1 | tee $OUT/pytest.log | tail -25
  echo "[$(el)s] tests done"
fi
[ "${CHECK:-}" = none ] || python3 lab/gpu_serve/${CHECK:-serve_check}.py --lab --model-path /tmp/models/$MODEL --out $W \
  --budget-s $(( BUDGET - $(el) - 40 )) "$@" 2>&1 | tee $W/serve_check.log | grep -v "^\[.*\] \(prefill\|decode\)"
cp $W/tables.md $W/serve_check.json $W/decode_ab.md $W/decode_ab.json $OUT/ 2>/dev/null
cat /tmp/ops/ops.* 2>/dev/null | awk '{c[$1]+=$2} END {for (k in c) print "lab stand-in op", k, c[k]}' | sort > $W/ops.txt
(cd $W && tar cf - --exclude=tables.md --exclude=serve_check.json . | xz -T0 -3 > $OUT/logs.tar.xz)
(cd /tmp && tar cf - $(ls -d triton jit 2>/dev/null) | xz -T0 -3 > $OUT/caches.tar.xz)
ls -la $OUT; echo "[$(el)s] done"
