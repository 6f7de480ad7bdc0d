"""Lab GPU machine only: `import sgl_kernel` -> sglang-replayssm's torch stand-in plus the few CUDA-path
names SGLang 0.5.23 calls, as torch code that runs on CUDA tensors (and inside CUDA graphs).

Why: the lab H200's torch 2.11 cannot load the real `sgl_kernel` (built against torch 2.14.1:
"undefined symbol c10::cuda::CUDAErrorLogCapture"). A user's GPU install has the real one and never
puts this folder on PYTHONPATH; `scripts/gpu_serve.sh` does, and sets SGLANG_REPLAYSSM_LAB_GPU=1.
Any other `sgl_kernel` name stays the stand-in's MissingOp, which raises naming the op when called.
Each call of a name added here is counted; SGLANG_REPLAYSSM_LAB_OPS_LOG=path writes the counts at exit.
"""


from __future__ import annotations

import atexit
import collections
import importlib.abc
import importlib.util
import os
import sys
import types

USED: collections.Counter = collections.Counter()


def _counted(name, fn):
    def wrapper(*args, **kwargs):
        USED[name] += 1
        return fn(*args, **kwargs)

    wrapper.__name__ = name
    wrapper.__wrapped__ = fn
    return wrapper


def _cuda_api() -> dict:
    import torch
    import torch.nn.functional as F

    def _rms(x, w, eps, gemma):
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        y = y * ((1.0 + w.float()) if gemma else w.float())
        return y.to(x.dtype)

    def _norm(gemma):
        def fn(input, weight, eps=1e-6, out=None, enable_pdl=None):
            y = _rms(input, weight, eps, gemma)
            if out is None:
                return y
            out.copy_(y)
            return out

        return fn

    rmsnorm, gemma_rmsnorm = _norm(False), _norm(True)

    def fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        residual.add_(input)
        input.copy_(_rms(residual, weight, eps, False))

    def gemma_fused_add_rmsnorm(input, residual, weight, eps=1e-6, enable_pdl=None):
        residual.add_(input)
        input.copy_(_rms(residual, weight, eps, True))

    def _act_and_mul(act):
        def fn(input, out=None, enable_pdl=None):
            d = input.shape[-1] // 2
            y = act(input[..., :d].float()) * input[..., d:].float()
            if out is None:
                return y.to(input.dtype)
            out.copy_(y)
            return out

        return fn

    def top_k_renorm_prob(probs, top_k, *args, **kwargs):
        k = torch.as_tensor(top_k, device=probs.device).long().reshape(-1, 1).expand(probs.shape[0], 1)
        sorted_p, _ = probs.sort(dim=-1, descending=True)
        thresh = sorted_p.gather(-1, k.clamp(1, probs.shape[-1]) - 1)
        p = torch.where(probs >= thresh, probs, torch.zeros_like(probs))
        return p / p.sum(-1, keepdim=True)

    def top_p_renorm_prob(probs, top_p, *args, **kwargs):
        tp = top_p if isinstance(top_p, float) else top_p.view(-1, 1)
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        cum = sorted_p.cumsum(-1)
        mask = (cum - sorted_p) > torch.as_tensor(tp, device=probs.device)
        sorted_p = sorted_p.masked_fill(mask, 0.0)
        p = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
        return p / p.sum(-1, keepdim=True)

    def weak_ref_tensor(t):
        # sgl_kernel returns a non-owning alias; a strong reference keeps the (graph pool) memory alive.
        return t

    api = {
        "rmsnorm": rmsnorm,
        "gemma_rmsnorm": gemma_rmsnorm,
        "fused_add_rmsnorm": fused_add_rmsnorm,
        "gemma_fused_add_rmsnorm": gemma_fused_add_rmsnorm,
        "silu_and_mul": _act_and_mul(F.silu),
        "gelu_and_mul": _act_and_mul(lambda x: F.gelu(x)),
        "gelu_tanh_and_mul": _act_and_mul(lambda x: F.gelu(x, approximate="tanh")),
        "top_k_renorm_prob": top_k_renorm_prob,
        "top_p_renorm_prob": top_p_renorm_prob,
        "weak_ref_tensor": weak_ref_tensor,
    }
    return {k: _counted(k, v) for k, v in api.items()}


def _utils_module(name: str) -> types.ModuleType:
    import torch

    from sglang_replayssm.cpu.standin import MissingOp

    mod = types.ModuleType(name)

    def is_arch_support_pdl() -> bool:
        # PDL launches need sm_90; reported off so Triton kernels launch without it (triton 3.6 here).
        USED["utils.is_arch_support_pdl"] += 1
        return os.environ.get("SGLANG_REPLAYSSM_LAB_PDL", "0") == "1" and torch.cuda.get_device_capability()[0] >= 9

    def __getattr__(attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return MissingOp(f"{name}.{attr}")

    mod.is_arch_support_pdl = is_arch_support_pdl
    mod.__getattr__ = __getattr__
    return mod


class _Loader(importlib.abc.Loader):
    def __init__(self, make):
        self.make = make

    def create_module(self, spec):
        return self.make(spec.name)

    def exec_module(self, module):
        return None


class _CudaStandinFinder(importlib.abc.MetaPathFinder):
    """`sgl_kernel`: the project's stand-in plus the CUDA-path API above; `sgl_kernel.utils`: ours."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "sgl_kernel":
            return importlib.util.spec_from_loader(fullname, _Loader(_make_root), is_package=True)
        if fullname == "sgl_kernel.utils":
            return importlib.util.spec_from_loader(fullname, _Loader(_utils_module), is_package=False)
        if fullname == "sgl_kernel.memory":
            return importlib.util.spec_from_loader(fullname, _Loader(_memory_module), is_package=False)
        return None


def _make_root(name):
    from sglang_replayssm.cpu.standin import _ops, submodule

    root = submodule("sglang_replayssm.cpu.standin", name)
    _ops.PYTHON_API.update(_cuda_api())
    return root


def _memory_module(name):
    from sglang_replayssm.cpu.standin import _ops

    mod = types.ModuleType(name)
    mod.weak_ref_tensor = _ops.PYTHON_API.get("weak_ref_tensor") or _cuda_api()["weak_ref_tensor"]
    return mod


def _write_log():
    path = os.environ.get("SGLANG_REPLAYSSM_LAB_OPS_LOG")
    if path and USED:
        with open(f"{path}.{os.getpid()}", "w") as f:
            for k, v in sorted(USED.items()):
                f.write(f"{k} {v}\n")


def install() -> None:
    from sglang_replayssm.cpu.autoload import _StandinFinder

    if any(isinstance(f, _CudaStandinFinder) for f in sys.meta_path):
        return
    sys.meta_path.insert(0, _StandinFinder())
    sys.meta_path.insert(0, _CudaStandinFinder())
    atexit.register(_write_log)
