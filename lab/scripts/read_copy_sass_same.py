"""Whether the product ``read_copy.cu`` compiles the serving builds to the same SASS as the full lab source.

Every distinct build :func:`~sglang_replayssm.kernels.read_copy_cuda.default_config` picks (B in 1, 64,
128, 256, 512, HV = 32, L = 16, GDN and KDA, bf16 and fp8 copies) is compiled with nvcc for ``--arch``
twice: from the product source with the product's build fields, and from ``--before`` (default: the lab
copy, ``lab/kernels/csrc/read_copy.cu``, which holds every research option) as a
:class:`~lab.kernels.read_copy_lab.LabReadCopyConfig` with the research options at their defaults.
``cuobjdump -sass`` of each, with addresses and encodings dropped, must be equal function by function.

    python lab/scripts/read_copy_sass_same.py [--before PATH] [--arch 90a] [--cuobjdump PATH]

Prints one line per build and exits 1 when any differs. Needs nvcc (``$NVCC`` or on PATH) and cuobjdump
(``--cuobjdump``, ``$CUOBJDUMP``, on PATH, or Triton's copy); no GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import ClassVar

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from lab.kernels.read_copy_lab import LabReadCopyConfig  # noqa: E402
from sglang_replayssm.kernels import read_copy_cuda as rc  # noqa: E402

_ADDR = re.compile(r"/\*[0-9a-f]{4,}\*/")  # instruction offsets
_ENC = re.compile(r"/\* 0x[0-9a-f]{16} \*/")  # instruction encodings
_ANON = re.compile(r"_GLOBAL__N__[0-9a-f]+_\d+_\w+?_[0-9a-f]{8}")  # the unnamed namespace's per-file hash


def serving_configs() -> list[rc.ReadCopyCudaConfig]:
    """The distinct builds (by build fields) default_config picks over the serving shapes."""
    seen: dict[tuple[object, ...], rc.ReadCopyCudaConfig] = {}
    for fmt in ("bf16", "fp8"):
        for B in (1, 64, 128, 256, 512):
            for kda in (False, True):
                c = rc.default_config(B, 32, 16, kda, fmt)
                seen.setdefault(tuple(rc.build_options(c).values()), c)
    return list(seen.values())


def cuobjdump() -> str:
    """The cuobjdump to use: $CUOBJDUMP, on PATH, or the one Triton ships."""
    found = os.environ.get("CUOBJDUMP") or shutil.which("cuobjdump")
    if found:
        return found
    import triton

    return str(Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump")


def sass(so: Path, tool: str) -> dict[str, list[str]]:
    """Function name -> its SASS lines: offsets, encodings and the unnamed namespace's file hash dropped, blank
    lines skipped."""
    text = subprocess.run([tool, "-sass", str(so)], check=True, capture_output=True, text=True).stdout
    funcs: dict[str, list[str]] = {}
    cur: list[str] | None = None
    for line in text.splitlines():
        line = _ANON.sub("_GLOBAL__N_", line)
        m = re.match(r"\s*Function : (\S+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        if cur is None:
            continue
        line = _ENC.sub("", _ADDR.sub("", line)).strip()
        if line:
            cur.append(line)
    return funcs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--before", type=Path, default=LabReadCopyConfig.SOURCE, help="the full source to compare with")
    ap.add_argument("--arch", default="90a")
    ap.add_argument("--cuobjdump", default=None)
    a = ap.parse_args()
    tool = a.cuobjdump or cuobjdump()

    @dataclasses.dataclass(frozen=True)
    class Before(LabReadCopyConfig):
        SOURCE: ClassVar[Path] = a.before

    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for c in serving_configs():
            opts = rc.build_options(c)
            after = rc.build(a.arch, out_dir=Path(tmp) / "after", **opts)  # type: ignore[arg-type]
            before = rc.build(a.arch, out_dir=Path(tmp) / "before", kind=Before, **opts)  # type: ignore[arg-type]
            sa, sb = sass(after, tool), sass(before, tool)
            ok = sa == sb and bool(sa)
            same &= ok
            n = sum(len(v) for v in sa.values())
            print(f"{'same' if ok else 'DIFFERENT'}  {after.name.rsplit('_', 1)[0]}: {len(sa)} kernels, "
                  f"{n} SASS lines (before: {len(sb)} kernels, {sum(len(v) for v in sb.values())} lines)")
            if not ok:
                for name in sorted(set(sa) | set(sb)):
                    if sa.get(name) != sb.get(name):
                        print(f"    differs: {name}")
    print("SASS identical" if same else "SASS differs")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
