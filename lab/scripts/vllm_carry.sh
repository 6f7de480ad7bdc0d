#!/usr/bin/env bash
# Build the carry folder of vLLM's packed GDN decode kernel (tests/support/vllm_fla.py loads it):
#   bash lab/scripts/vllm_carry.sh [DEST]          (DEST default .gpucarry/vllm_fla, from the repository root)
# Downloads vLLM's wheel (VLLM_VERSION, default 0.34.0; no install, no dependencies) into $WHL_DIR (default
# /tmp/vllm_whl, reused when there), extracts only fused_recurrent.py (the module defining
# fused_recurrent_gated_delta_rule_packed_decode) and the ops modules it imports relatively, under their
# package path, and writes a minimal stub of the vllm modules they import (vllm.platforms, vllm.triton_utils,
# vllm.utils.platform_utils), empty package __init__ files and MODULE (the kernel module's dotted name).
# Fails if the extracted files import a vllm module the stub does not provide. PY: the python to run pip with.
set -euo pipefail
cd "$(dirname "$0")/../.."
DEST=${1:-.gpucarry/vllm_fla}
VLLM_VERSION=${VLLM_VERSION:-0.34.0}
WHL_DIR=${WHL_DIR:-/tmp/vllm_whl}
PY=${PY:-python3}
mkdir -p "$WHL_DIR"
WHL=$(ls "$WHL_DIR"/vllm-"$VLLM_VERSION"-*.whl 2>/dev/null | head -1 || true)
if [ -z "$WHL" ]; then
  "$PY" -m pip download -q --no-deps --only-binary=:all: -d "$WHL_DIR" "vllm==$VLLM_VERSION"
  WHL=$(ls "$WHL_DIR"/vllm-"$VLLM_VERSION"-*.whl | head -1)
fi
rm -rf "$DEST"
"$PY" - "$WHL" "$DEST" <<'PY'
import ast
import sys
import zipfile
from pathlib import Path

whl, dest = sys.argv[1], Path(sys.argv[2])
z = zipfile.ZipFile(whl)
names = set(z.namelist())
want = "def fused_recurrent_gated_delta_rule_packed_decode("
cands = sorted(n for n in names if n.endswith("/fused_recurrent.py") and want in z.read(n).decode())
cands = [n for n in cands if "/models/" not in n]  # the shared FLA ops, not a model's private copy
if not cands:
    sys.exit(f"{whl}: no fused_recurrent.py defines the packed decode")
top = cands[0]
ops = top.rsplit("/", 1)[0]
todo, done, absolute = [top], set(), set()
while todo:
    path = todo.pop()
    if path in done:
        continue
    done.add(path)
    for node in ast.walk(ast.parse(z.read(path))):
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module:
            todo.append(f"{ops}/{node.module.replace('.', '/')}.py")
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("vllm"):
            absolute.add(node.module)
        elif isinstance(node, ast.Import):
            absolute.update(a.name for a in node.names if a.name.startswith("vllm"))
STUBS = {
    "vllm/__init__.py": '"""Stub of vllm for the carried kernel files (tests/support/vllm_fla.py): not vLLM."""\n'
                        "VLLM_FLA_STUB = True\n",
    "vllm/platforms/__init__.py": '''"""Stub: current_platform answered from torch."""
from typing import NamedTuple

import torch


class DeviceCapability(NamedTuple):
    major: int
    minor: int

    def to_int(self) -> int:
        return self.major * 10 + self.minor


class _Platform:
    def is_cuda(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is None

    def is_rocm(self) -> bool:
        return torch.cuda.is_available() and torch.version.hip is not None

    def is_cuda_alike(self) -> bool:
        return torch.cuda.is_available()

    def is_xpu(self) -> bool:
        return False

    def get_device_name(self, device_id=0) -> str:
        try:
            return torch.cuda.get_device_name(device_id or 0)
        except Exception:
            return "cpu"

    def get_device_capability(self, device_id=0):
        try:
            return DeviceCapability(*torch.cuda.get_device_capability(device_id or 0))
        except Exception:
            return None

    def is_device_capability(self, capability, device_id=0) -> bool:
        cap = self.get_device_capability(device_id)
        if cap is None:
            return False
        return cap == tuple(capability) if isinstance(capability, tuple) else cap.to_int() == capability

    def is_device_capability_family(self, capability, device_id=0) -> bool:
        cap = self.get_device_capability(device_id)
        return cap is not None and cap.to_int() // 10 == capability // 10


current_platform = _Platform()
''',
    "vllm/triton_utils/__init__.py": '''"""Stub: triton, tl and libdevice."""
import triton
import triton.language as tl

try:
    import triton.language.extra.libdevice as tldevice
except ImportError:  # pragma: no cover
    tldevice = None
HAS_TRITON = True
''',
    "vllm/utils/__init__.py": '"""Stub."""\n',
    "vllm/utils/platform_utils.py": '''"""Stub: device properties from torch."""
import torch


def cuda_get_device_properties(device, names, init_cuda=False):
    props = torch.cuda.get_device_properties(device)
    return tuple(getattr(props, n) for n in names)
''',
}
provided = {p[:-3].replace("/", ".").removesuffix(".__init__") for p in STUBS}
missing = sorted(m for m in absolute if m not in provided)
if missing:
    sys.exit(f"the extracted files import vllm modules the stub lacks: {missing}")
for path in sorted(done):
    out = dest / path
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(z.read(path))
for path, text in STUBS.items():
    (dest / path).parent.mkdir(parents=True, exist_ok=True)
    (dest / path).write_text(text)
pkg = Path(ops)
while str(pkg) not in (".", "vllm"):  # the kernel's packages, empty (the wheel's __init__ files import more)
    init = dest / pkg / "__init__.py"
    if not init.exists():
        init.write_text("")
    pkg = pkg.parent
module = top[:-3].replace("/", ".")
(dest / "MODULE").write_text(module + "\n")
(dest / "SOURCE").write_text(f"{Path(whl).name}\n" + "".join(f"{p}\n" for p in sorted(done)))
print(f"{dest}: {module} from {Path(whl).name} ({len(done)} files: {', '.join(sorted(p.rsplit('/', 1)[1] for p in done))})")
PY
