"""Seeded float32 weights from transformers' own classes, renamed to the checkpoint names SGLang loads."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sglang_replayssm.models.specs import SPECIAL_TOKENS, ModelSpec

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

    hf_cfg = hf_config_class(spec.family).from_dict(dict(cfg))
    hf_cfg._attn_implementation = "eager"
    torch.manual_seed(spec.seed)
    with _default_dtype(torch.float32):
        model = hf_model_class(spec.family)(hf_cfg)
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
    return model


@contextlib.contextmanager
def _default_dtype(dtype: Any) -> Iterator[None]:
    import torch

    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def _checkpoint_state_dict(spec: ModelSpec, model: Any) -> dict[str, Any]:
    """The model's weights under the checkpoint names SGLang's loader (and transformers) read."""
    import torch

    sd = {k: v.detach().to(torch.float32).contiguous().clone() for k, v in model.state_dict().items()}
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
