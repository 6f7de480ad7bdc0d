# Sourced (bash) from the repository root by scripts/gpu_serve.sh and lab/scripts/gpu_serving_protocol.sh: installs
# the carry $C (default .gpucarry, built by lab/gpu_serve/carry.sh) into the target folder $S (default /tmp/site):
# its wheels (SGLang 0.5.23's missing dependencies, no index, no dependency resolution), SGLang's tree
# (sglang.tar.xz), the prebuilt CUDA passes into /tmp/rrcache (cuda/, and cuda-*.tar.xz: research builds packed
# by lab/scripts/ring_sweep_carry.sh) (point SGLANG_REPLAYSSM_CUDA_CACHE there), the
# Triton / JIT caches of an earlier call (caches.tar.*) into /tmp, and this tree as the plugin (a dist-info with
# its entry points); then touches $S/.carry-installed (a second check in the same device call skips the install).
# Sets nothing in the environment; the caller sets PYTHONPATH and the variables.
C=${C:-.gpucarry}
S=${S:-/tmp/site}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $S $C/whl/*.whl 2>&1 | tail -3
tar xJf $C/sglang.tar.xz -C $S
mkdir -p /tmp/rrcache && cp -r $C/cuda/. /tmp/rrcache/
for f in $C/cuda-*.tar.xz; do [ -f "$f" ] && tar xJf "$f" -C /tmp/rrcache --strip-components=1; done  # research builds
for f in $C/caches.tar.*; do [ -f "$f" ] && tar xf "$f" -C /tmp; done
python3 - "$S" <<'PY'
import sys, tomllib
from pathlib import Path
p = tomllib.load(open("pyproject.toml", "rb"))["project"]
d = Path(sys.argv[1]) / f"sglang_replayssm-{p['version']}.dist-info"
d.mkdir(parents=True, exist_ok=True)
(d / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {p['name']}\nVersion: {p['version']}\n")
(d / "top_level.txt").write_text("sglang_replayssm\n")
(d / "entry_points.txt").write_text("".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                                            for g, eps in p["entry-points"].items()))
PY
touch $S/.carry-installed
