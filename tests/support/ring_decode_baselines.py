"""SGLang 0.5.23's own decode kernels, loaded by path for side-by-side benchmarks (no SGLang install).

The GPU box has no SGLang. The benchmark carries the handful of SGLang files it needs (the kernel
sources are byte-identical across wheels) and this module imports them under their real module
names with *stub parent packages*, so that ``sglang/__init__.py`` and the rest of SGLang never run.
Nothing here is SGLang code: it only locates, imports and calls it.

* ``replayssm``: ``fused_recurrent_linear_replayssm_decode`` (GDN and KDA, Triton);
* ``gdn_packed``: ``fused_recurrent_gated_delta_rule_packed_decode`` (Triton);
* ``kda_packed_triton``: ``fused_recurrent_kda_packed_decode`` with its CUDA fast path disabled;
* ``kda_packed_cuda``: the row-streaming CUDA kernel ``kda_packed_decode.cuh`` (SGLang JIT-builds
  it through tvm_ffi; :func:`build_kda_packed_cuda` compiles the same header with nvcc and loads
  it through ``tvm_ffi.load_module``). ``None`` plus ``cuda_error`` when it cannot be built.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

__all__ = ["SGLangKernels", "build_kda_packed_cuda", "load_sglang_kernels"]

_FLA = "sglang.kernels.ops.attention.fla"
_LINEAR = "sglang.kernels.ops.attention.linear"
_ATTN = "sglang.kernels.ops.attention"


@dataclass
class SGLangKernels:
    """Callables with SGLang's own signatures (see module docstring)."""

    replayssm: Callable
    gdn_packed: Callable
    kda_packed_triton: Callable
    kda_packed_cuda: Callable | None
    cuda_error: str | None


def _stub_package(name: str, path: Path | None) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.__path__ = [str(path)] if path is not None else []
    sys.modules[name] = mod
    return mod


def _install_stubs(root: Path) -> None:
    """Register parent packages of the kernel files without executing any ``__init__``."""
    base = root / "sglang"
    for name, rel in (
        ("sglang", ""),
        ("sglang.kernels", "kernels"),
        ("sglang.kernels.ops", "kernels/ops"),
        (_ATTN, "kernels/ops/attention"),
        (_FLA, "kernels/ops/attention/fla"),
        (_LINEAR, "kernels/ops/attention/linear"),
        ("sglang.srt", None),
        ("sglang.srt.utils", None),
    ):
        if name not in sys.modules:
            _stub_package(name, base / rel if rel is not None else None)
    if "sglang.srt.utils.common" not in sys.modules:
        common = types.ModuleType("sglang.srt.utils.common")
        release = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:3] if x.isdigit())
        common.__dict__["torch_release"] = release
        sys.modules["sglang.srt.utils.common"] = common
    # fused_recurrent_kda_packed_decode imports this lazily for its CUDA path: a stub that never
    # covers keeps it on its Triton kernel (the CUDA kernel is benchmarked on its own).
    stub = types.ModuleType(f"{_ATTN}.kda_packed_decode")
    stub.covered = lambda *a, **k: False  # type: ignore[attr-defined]
    sys.modules[f"{_ATTN}.kda_packed_decode"] = stub


def build_kda_packed_cuda(root: Path, build_dir: Path, *, warps: int = 8, pdl: bool = True) -> Callable:
    """Compile SGLang's ``kda_packed_decode.cuh`` (sm_90a) and return a caller with the signature
    of SGLang's ``kda_packed_decode(mixed_qkv, a, b, A_log, dt_bias, scale, initial_state, out,
    ssm_state_indices, num_q_heads, lower_bound=None)``."""
    import tvm_ffi
    import tvm_ffi.libinfo as libinfo

    header = root / "sglang/kernels/jit/csrc/attention/kda_packed_decode.cuh"
    include = root / "sglang/kernels/jit/include"
    build_dir.mkdir(parents=True, exist_ok=True)
    so = build_dir / f"kda_packed_decode_{warps}_{int(pdl)}.so"
    if so.exists():  # a prebuilt copy: use it if it loads, else rebuild here
        try:
            return _caller(tvm_ffi.load_module(str(so)))
        except Exception:
            so.unlink()
    if not so.exists():
        src = build_dir / "kda_packed_decode_wrapper.cu"
        src.write_text(
            "#include <tvm/ffi/container/tensor.h>\n#include <tvm/ffi/dtype.h>\n#include <tvm/ffi/error.h>\n"
            "#include <tvm/ffi/extra/c_env_api.h>\n#include <tvm/ffi/function.h>\n"
            f'#include "{header}"\n'
            "namespace sglang {\n"
            f"TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, (KdaPackedDecodeKernel<{warps}, {'true' if pdl else 'false'}>::run));\n"
            "}\n"
        )
        cmd = [
            os.environ.get("NVCC", "nvcc"), "-gencode=arch=compute_90a,code=sm_90a", "-DSGL_CUDA_ARCH=900",
            "-std=c++20", "-O3", "--expt-relaxed-constexpr", "-shared", "-Xcompiler", "-fPIC",
            f"-I{include}", *[f"-I{p}" for p in libinfo.include_paths()], str(src), "-o", str(so),
            f"-L{os.path.dirname(libinfo.find_libtvm_ffi())}", "-ltvm_ffi",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, capture_output=True, text=True)
    return _caller(tvm_ffi.load_module(str(so)))


def _caller(mod: object) -> Callable:
    """Wrap the tvm_ffi module's ``run`` with SGLang's ``kda_packed_decode`` Python signature."""

    def kda_packed_decode(
        mixed_qkv: torch.Tensor,
        a: torch.Tensor,
        b: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
        scale: float,
        initial_state: torch.Tensor,
        out: torch.Tensor,
        ssm_state_indices: torch.Tensor,
        num_q_heads: int,
        lower_bound: float | None = None,
    ) -> None:
        B = mixed_qkv.shape[0]
        HV, V, _ = initial_state.shape[-3:]
        mod.run(  # type: ignore[attr-defined]
            mixed_qkv, a, b, A_log, dt_bias, out.view(B, HV, V), initial_state.view(-1, *initial_state.shape[-3:]),
            ssm_state_indices, float(scale), float(lower_bound or 0.0), lower_bound is not None, int(num_q_heads),
        )  # fmt: skip

    return kda_packed_decode


def _load_file(name: str, path: Path) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def load_sglang_kernels(root: Path, build_dir: Path | None = None, *, build_cuda: bool = True) -> SGLangKernels:
    """Import SGLang's decode kernels from ``root`` (a folder holding ``sglang/...`` files); ``build_cuda=False``
    leaves the KDA CUDA kernel out (``kda_packed_cuda`` None; the caller may :func:`build_kda_packed_cuda` it)."""
    root = Path(root).resolve()
    _install_stubs(root)
    base = root / "sglang/kernels/ops/attention"
    _load_file(f"{_FLA}.utils", base / "fla/utils.py")
    _load_file(f"{_FLA}.op", base / "fla/op.py")
    fr = _load_file(f"{_FLA}.fused_recurrent", base / "fla/fused_recurrent.py")
    rs = _load_file(f"{_LINEAR}.fused_recurrent_linear_replayssm", base / "linear/fused_recurrent_linear_replayssm.py")
    cuda_fn: Callable | None = None
    err: str | None = None if build_cuda else "not built here"
    try:
        if build_cuda:
            cuda_fn = build_kda_packed_cuda(root, build_dir or Path("/tmp/kda_packed_build"))
    except subprocess.CalledProcessError as e:  # pragma: no cover - GPU box only
        err = f"nvcc failed: {(e.stderr or '')[-400:]}"
    except Exception as e:  # pragma: no cover - GPU box only
        err = f"{type(e).__name__}: {e}"
    return SGLangKernels(
        replayssm=rs.fused_recurrent_linear_replayssm_decode,
        gdn_packed=fr.fused_recurrent_gated_delta_rule_packed_decode,
        kda_packed_triton=fr.fused_recurrent_kda_packed_decode,
        kda_packed_cuda=cuda_fn,
        cuda_error=err,
    )
