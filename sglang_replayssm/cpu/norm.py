"""Torch gated RMSNorm for CPU tensors (replaces fla.layernorm_gated.RMSNorm's Triton/AMX path on CPU)."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _act(z: torch.Tensor, activation: str) -> torch.Tensor:
    if activation in ("swish", "silu"):
        return F.silu(z)
    if activation == "sigmoid":
        return torch.sigmoid(z)
    raise ValueError(f"gated RMSNorm: unsupported activation {activation!r}")


def rms_norm_gated(x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor | None, eps: float,
                   group_size: int | None, norm_before_gate: bool, activation: str) -> torch.Tensor:
    """norm(x) * act(z) if norm_before_gate else norm(x * act(z)); RMS per group of group_size channels."""
    xf = x.float()
    if z is not None and not norm_before_gate:
        xf = xf * _act(z.float(), activation)
    n = xf.shape[-1]
    gs = n if group_size is None else group_size
    xg = xf.reshape(*xf.shape[:-1], n // gs, gs)
    y = (xg * torch.rsqrt(xg.pow(2).mean(-1, keepdim=True) + eps)).reshape(xf.shape) * weight.float()
    if z is not None and norm_before_gate:
        y = y * _act(z.float(), activation)
    return y.to(x.dtype)


def rmsnorm_gated_forward(original, self, x, z=None):
    """AROUND hook body for RMSNorm.forward: torch on CPU tensors, SGLang's path elsewhere."""
    if x.device.type != "cpu":
        return original(self, x, z)
    return rms_norm_gated(x, self.weight, z, self.eps, self.group_size, self.norm_before_gate,
                          getattr(self, "activation", "swish"))
