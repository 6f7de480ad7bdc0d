"""Seeded weights from transformers' own classes, renamed to the checkpoint names SGLang loads.

The model is always built and initialised in float32; the checkpoint is written in the spec's
``weight_dtype``. Float32 specs (the tiny/small models) construct the model as transformers does
(torch's per-module init, then transformers' ``post_init``), byte-for-byte as they always have. Other
specs (the real-shape bfloat16 models) skip torch's per-module init, which transformers' init redraws
anyway and which dominates the build time at 0.5 B parameters: the model is constructed on the meta
device, materialised on the CPU and initialised by transformers' own ``initialize_weights`` (the same
``_init_weights`` code ``post_init`` runs), from the same seeded global generator.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from sglang_replayssm.models.specs import MEMORY_INITS, SPECIAL_TOKENS, WEIGHT_DTYPES, ModelSpec

# transformers' classes of each family: (model, config), named explicitly (not through AutoModel).
_HF_CLASSES = {"gdn": ("Qwen3_5ForCausalLM", "Qwen3_5TextConfig"), "kda": ("KimiLinearForCausalLM", "KimiLinearConfig")}


def _hf_class(family: str, which: int) -> Any:
    if family not in _HF_CLASSES:
        raise ValueError(f"unknown model family {family!r}")
    import transformers

    return getattr(transformers, _HF_CLASSES[family][which])


def hf_model_class(family: str) -> type:
    """The transformers model class of a family."""
    cls: type = _hf_class(family, 0)
    return cls


def hf_config_class(family: str) -> Any:
    """The transformers config class of a family."""
    return _hf_class(family, 1)


def _hf_model(spec: ModelSpec, cfg: dict[str, Any]) -> Any:
    """A freshly initialised, seeded, float32 transformers model for ``cfg``."""
    import torch

    weight_dtype(spec)  # refuses an unsupported one before any work
    if spec.memory_init is not None and spec.memory_init not in MEMORY_INITS:
        raise ValueError(f"{spec.name}: unsupported memory_init {spec.memory_init!r} (one of {MEMORY_INITS})")
    hf_cfg = hf_config_class(spec.family).from_dict(dict(cfg))
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    with _default_dtype(torch.float32), _all_threads():
        if spec.weight_dtype == "float32":
            model = hf_model_class(spec.family)(hf_cfg)
        else:
            model = _hf_model_fast_init(hf_model_class(spec.family), hf_cfg)
    model = model.float().eval()
    gen = torch.Generator().manual_seed(spec.seed + 7)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            if name.endswith("norm.weight") or name.endswith("layernorm.weight"):
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype) * spec.norm_noise)
        for name, b in sorted(model.named_buffers(), key=lambda kv: kv[0]):
            if name.endswith("e_score_correction_bias"):
                b.copy_(torch.randn(b.shape, generator=gen, dtype=b.dtype) * spec.norm_noise)
        # Special tokens never win a greedy argmax: their logits are exactly 0.
        model.lm_head.weight[: len(SPECIAL_TOKENS)].zero_()
        if spec.memory_init == "mamba":
            _memory_init(spec, model)
    return model


# Mamba's decay recipe (``ModelSpec.memory_init == "mamba"``): dt log-uniform in [DT_MIN, DT_MAX] per gate
# channel, A uniform in [A_MIN, A_MAX] per head; and the RMS of the gate's data-dependent input (for a
# unit-variance hidden state) is scaled to GATE_INPUT_STD, so softplus(a + dt_bias) stays within about
# e^(+-GATE_INPUT_STD) of dt rather than swamping it.
DT_MIN, DT_MAX = 1e-3, 1e-1
A_MIN, A_MAX = 1.0, 16.0
GATE_INPUT_STD = 0.5


def _memory_init(spec: ModelSpec, model: Any) -> None:
    """Redraw every linear-attention layer's decay gate (``g = -exp(A_log) * softplus(a + dt_bias)``,
    the formula of transformers' and SGLang's GDN and KDA alike) by Mamba's recipe, seeded by the spec.

    GDN (Qwen3.5 ``linear_attn``): A_log and dt_bias per value head, ``a = in_proj_a(x)``.
    KDA (Kimi-Linear ``self_attn.forget_gate``): A_log per head, dt_bias per (head, key channel),
    ``a = f_b_proj(f_a_proj(x))`` (the scale goes on f_b_proj)."""
    import math

    import torch

    gen = torch.Generator().manual_seed(spec.seed + 13)
    n = 0
    for _, module in sorted(model.named_modules(), key=lambda kv: kv[0]):
        if spec.family == "gdn" and hasattr(module, "in_proj_a") and hasattr(module, "A_log"):
            w_gate, scaled = module.in_proj_a.weight, module.in_proj_a.weight
        elif spec.family == "kda" and hasattr(module, "f_b_proj") and hasattr(module, "A_log"):
            w_gate, scaled = module.f_b_proj.weight @ module.f_a_proj.weight, module.f_b_proj.weight
        else:
            continue
        a_log, dt_bias = module.A_log, module.dt_bias
        A = torch.empty(a_log.numel(), dtype=torch.float32).uniform_(A_MIN, A_MAX, generator=gen)
        log_dt = torch.empty(dt_bias.numel(), dtype=torch.float32).uniform_(
            math.log(DT_MIN), math.log(DT_MAX), generator=gen)
        dt = log_dt.exp().clamp_min(1e-4)
        a_log.copy_(A.log().view_as(a_log))
        dt_bias.copy_((dt + torch.log(-torch.expm1(-dt))).view_as(dt_bias))  # inverse softplus
        rms = float(w_gate.float().pow(2).sum(dim=1).mean().sqrt())
        scaled.mul_(GATE_INPUT_STD / rms)
        n += 1
    if n == 0:
        raise RuntimeError(f"{spec.name}: memory_init found no {spec.family} decay gate to initialise")


def _hf_model_fast_init(cls: Any, hf_cfg: Any) -> Any:
    """``cls(hf_cfg)`` initialised by transformers' ``_init_weights`` alone (no torch per-module init)."""
    import torch

    with torch.device("meta"):  # torch's init functions are no-ops here, and post_init skips its init
        model = cls(hf_cfg)
    model = model.to_empty(device="cpu")  # uninitialised memory until _init_weights writes it
    tensors = dict(model.named_parameters())
    tensors.update(model.named_buffers())
    versions = {name: t._version for name, t in tensors.items()}  # bumped by every in-place write
    for module in model.modules():  # in case a transformers version marks modules done on the meta device
        if getattr(module, "_is_hf_initialized", False):
            module._is_hf_initialized = False
    model.initialize_weights()  # (our configs never tie the embeddings: nothing to tie)
    left = [name for name, t in tensors.items() if t._version == versions[name]]
    if left:
        raise RuntimeError(f"transformers' init left {len(left)} tensor(s) of {cls.__name__} unset: {left[:8]}")
    return model


@contextlib.contextmanager
def _all_threads() -> Iterator[None]:
    """Every CPU this process may run on, for the init and the casts (the random draws do not depend on it)."""
    import torch

    threads = torch.get_num_threads()
    want = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(want, threads))
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def weight_dtype(spec: ModelSpec) -> Any:
    """The torch dtype of ``spec``'s weights on disk."""
    import torch

    if spec.weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"{spec.name}: unsupported weight_dtype {spec.weight_dtype!r} (one of {WEIGHT_DTYPES})")
    return getattr(torch, spec.weight_dtype)


def _checkpoint_state_dict(spec: ModelSpec, model: Any) -> dict[str, Any]:
    """The model's weights under the checkpoint names SGLang's loader (and transformers) read, in the spec's
    ``weight_dtype``."""
    sd = {k: v.detach().to(weight_dtype(spec), copy=True).contiguous() for k, v in model.state_dict().items()}
    if spec.family == "gdn":
        return sd
    out: dict[str, Any] = {}
    for name, t in sd.items():
        if ".self_attn.forget_gate." in name:
            out[name.replace(".self_attn.forget_gate.", ".self_attn.")] = t
        elif name.endswith(".self_attn.conv1d.weight"):
            q, k, v = t.chunk(3, dim=0)
            base = name[: -len("conv1d.weight")]
            out[base + "q_conv1d.weight"] = q.contiguous()
            out[base + "k_conv1d.weight"] = k.contiguous()
            out[base + "v_conv1d.weight"] = v.contiguous()
        elif ".mlp.experts.gate_up_proj" in name:
            base = name.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.")
            inter = t.shape[1] // 2
            for e in range(t.shape[0]):
                out[f"{base}{e}.w1.weight"] = t[e, :inter].contiguous()
                out[f"{base}{e}.w3.weight"] = t[e, inter:].contiguous()
        elif ".mlp.experts.down_proj" in name:
            base = name.replace(".mlp.experts.down_proj", ".block_sparse_moe.experts.")
            for e in range(t.shape[0]):
                out[f"{base}{e}.w2.weight"] = t[e].contiguous()
        elif ".mlp.gate." in name or ".mlp.shared_experts." in name:
            out[name.replace(".mlp.", ".block_sparse_moe.")] = t
        else:
            out[name] = t  # includes the dense layer-0 MLP as mlp.*
    return out
