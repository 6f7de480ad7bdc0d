#!/usr/bin/env bash
# The CUDA builds that lab/scripts/bench_ring_configs.py's B=64 sweep (notes/kernels.md, "B=64 launch sweep") needs
# beyond .gpucarry/cuda, compiled here with nvcc for sm_90a (H100 / H200) and packed as .gpucarry/cuda-sweep.tar.xz
# (xz: ~3 MB for ~24 MB of .so), so the device call builds nothing. From the repository root, with .venv, after
# lab/gpu_serve/carry.sh:
#   bash lab/scripts/ring_sweep_carry.sh
# lab/gpu_serve/install_carry.sh (scripts/gpu_serve.sh) unpacks it into /tmp/rrcache with the other builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=$(mktemp -d); mkdir -p $W/cuda .gpucarry
export SGLANG_REPLAYSSM_CUDA_CACHE=$W/cuda
PY=.venv/bin/python
P=()
# ring_read.cu: (min_blocks, flush_min_blocks, stages, flush_stages, bulk, flush_bulk, fused)
for spec in "4,1,3,3,False,False,3" "4,1,3,3,False,False,0" "4,1,4,3,True,False,3" "4,1,4,3,True,False,4" \
            "4,1,4,3,True,False,0"; do
  $PY -c "
from sglang_replayssm.kernels import ring_decode_cuda as r
mb, fmb, st, fst, bk, fbk, fu = ($spec)
print(r.build('90a', mb, flush_min_blocks=fmb, stages=st, flush_stages=fst, bulk=bk, flush_bulk=fbk, fused=fu).name)" &
  P+=($!)
done
# read_copy.cu at B=64 (the register path): GDN and KDA defaults with these fields changed
for kda in False True; do
  for ov in "read_warps=1" "depth=3" "depth=3,read_warps=1"; do
    $PY -c "
import dataclasses
from sglang_replayssm.kernels import read_copy_cuda as r
cfg = dataclasses.replace(r.default_config(64, 32, 16, $kda), $ov)
o = r.build_options(cfg); d = o.pop('depth'); m = o.pop('min_blocks')
print(r.build('90a', d, m, **o).name)" &
    P+=($!)
  done
done
for p in "${P[@]}"; do wait "$p"; done  # a failed build stops here (set -e)
(cd $W && tar cf - cuda | xz -T0 -6 > "$OLDPWD/.gpucarry/cuda-sweep.tar.xz")
ls -la .gpucarry/cuda-sweep.tar.xz; rm -rf $W
