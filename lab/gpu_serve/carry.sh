#!/usr/bin/env bash
# Build the lab GPU serving carry into .gpucarry/ (ignored by git; < 60 MiB), here, before a device call:
#   lab/gpu_serve/carry.sh            (needs the project's .venv: `make env`; network to PyPI; nvcc)
#   sglang.tar.xz  SGLang 0.5.23's cp312 wheel, less what a text server never imports (multimodal_gen/,
#                  the gRPC / Rust-server / bench / multimodal Rust .so, __pycache__)
#   whl/           cp312 wheels of SGLang's import-time dependencies the device image lacks, and the lock's
#                  transformers (the device has an older one); versions from requirements.lock
#   cuda/          ring_read.cu's default build (and its row-map twin) and read_copy.cu's serving builds, sm_90a
#   caches.tar.xz  Triton / JIT caches a previous call brought back (copy it here from its $OUT), if any
set -euo pipefail
cd "$(dirname "$0")/../.."
C=.gpucarry; PY=.venv/bin/python
[ -x $PY ] || { echo "carry.sh: no .venv here; run 'make env' first" >&2; exit 2; }
mkdir -p $C/whl $C/cuda /tmp/gpucarry-stage
ver=$(sed -n 's/^sglang==//p' requirements.lock)
wheel=$(ls /tmp/gpucarry-stage/sglang-$ver-cp312-*.whl 2>/dev/null | head -1 || true)
if [ -z "$wheel" ]; then
  $PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_34_x86_64 -d /tmp/gpucarry-stage "sglang==$ver"
  wheel=$(ls /tmp/gpucarry-stage/sglang-$ver-cp312-*.whl | head -1)
fi
if [ ! -f $C/sglang.tar.xz ] || [ "$wheel" -nt $C/sglang.tar.xz ] || [ "$0" -nt $C/sglang.tar.xz ]; then
  rm -rf /tmp/gpucarry-stage/site && mkdir -p /tmp/gpucarry-stage/site
  (cd /tmp/gpucarry-stage/site && unzip -q "$wheel" \
    && rm -rf sglang/multimodal_gen sglang-$ver.dist-info/RECORD \
    && rm -f sglang/srt/rust_extensions/_server.*.so sglang/srt/rust_extensions/_grpc.*.so \
             sglang/srt/rust_extensions/_bench.*.so sglang/srt/rust_extensions/_multimodal.*.so \
    && find . -name __pycache__ -prune -exec rm -rf {} + \
    && tar cf - sglang sglang-$ver.dist-info | xz -T0 -6 > "$OLDPWD/$C/sglang.tar.xz")
fi
names="pybase64 pydantic pydantic-core annotated-types typing-inspection orjson pyzmq msgspec setproctitle fastapi
  starlette uvicorn python-multipart partial-json-parser openai jiter distro sniffio opentelemetry-api dill
  apache-tvm-ffi compressed-tensors loguru gguf jsonschema referencing rpds-py jsonschema-specifications xgrammar
  transformers"
pin() { grep -i -E "^$(echo "$1" | sed 's/[-_]/[-_]/g')==" requirements.lock; }
pins=$(for n in $names; do pin $n || { echo "carry.sh: $n not in requirements.lock" >&2; exit 2; }; done)
platforms=""; for p in 2_34 2_28 2_27 2_26 2_24 2_17 2014 1 2_5; do
  case $p in 2014|1) platforms+=" --platform manylinux${p}_x86_64";; *) platforms+=" --platform manylinux_${p}_x86_64";; esac; done
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp $platforms \
  -d $C/whl $pins
# One version of each: drop wheels of versions the lock no longer names.
for w in $C/whl/*.whl; do
  base=$(basename "$w"); v=$(echo "$base" | cut -d- -f2)
  [ "$(pin "${base%%-*}" | cut -d= -f3)" = "$v" ] || rm -f "$w"
done
$PY - $C/cuda <<'PYEOF'
import sys
from pathlib import Path
from sglang_replayssm.kernels import read_copy_cuda as rc
from sglang_replayssm.kernels.ring_decode_cuda import DEFAULT_BUILD, DEFAULT_FUSED, build
out = Path(sys.argv[1])
mb, fb, st, fst, bk, fbk = DEFAULT_BUILD
for ring_map in (False, True):  # rings keyed by slot, and by request row (SGLANG_REPLAYSSM_RING_ROWS)
    print(build("90a", mb, out, flush_min_blocks=fb, stages=st, flush_stages=fst, bulk=bk, flush_bulk=fbk,
                fused=DEFAULT_FUSED, ring_map=ring_map).name)
seen = set()
for B in (1, 64, 128, 256, 512):
    for kda in (False, True):
        c = rc.default_config(B, 32, 16, kda, "bf16")
        key = tuple(rc.build_options(c).items())
        if key in seen:
            continue
        seen.add(key)
        print(rc.build("90a", out_dir=out, **rc.build_options(c)).name)
PYEOF
du -sh $C $C/* | sort -h
