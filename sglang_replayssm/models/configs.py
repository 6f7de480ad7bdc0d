"""config.json / generation_config.json of each family, in the layout transformers and SGLang 0.5.23 both read."""

from __future__ import annotations

from typing import Any

from sglang_replayssm.models.specs import ENDOFTEXT_ID, IM_END_ID, PAD_ID, ModelSpec


def _common_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    """What both families' config.json hold: vocabulary, dtype, special tokens, norm and activation, the
    transformer dims every spec's shape names, no attention bias or dropout, the init std."""
    s = spec.shape
    return {
        "vocab_size": vocab,
        "torch_dtype": spec.weight_dtype,
        "dtype": spec.weight_dtype,
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "use_cache": True,
        "max_position_embeddings": 32768,
        "hidden_size": s["hidden_size"],
        "intermediate_size": s["intermediate_size"],
        "num_hidden_layers": s["num_hidden_layers"],
        "num_attention_heads": s["num_attention_heads"],
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": spec.init_std,
    }


def _copied(shape: dict[str, Any], *keys: str) -> dict[str, Any]:
    """The config fields that take a spec's shape entry of the same name unchanged."""
    return {k: shape[k] for k in keys}


def gdn_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    """config.json of a Qwen3.5 text GDN hybrid (read by transformers and SGLang alike)."""
    s = spec.shape
    n_layers = s["num_hidden_layers"]
    interval = s["full_attention_interval"]
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    cfg = _common_config(spec, vocab)
    cfg.update(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        full_attention_interval=interval,
        layer_types=layer_types,
        **_copied(s, "num_key_value_heads", "head_dim", "linear_conv_kernel_dim", "linear_key_head_dim",
                  "linear_value_head_dim", "linear_num_key_heads", "linear_num_value_heads"),
        partial_rotary_factor=0.25,
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    return cfg


def kda_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    """config.json of a Kimi-Linear KDA hybrid, in the checkpoint layout both libraries read."""
    s = spec.shape
    cfg = _common_config(spec, vocab)
    cfg.update(
        architectures=["KimiLinearForCausalLM"],
        model_type="kimi_linear",
        # SGLang 0.5.23's KimiDeltaAttention never passes config.rms_norm_eps to its o_norm (it keeps
        # its 1e-5 default); HF reads the config. Use 1e-5 so both libraries compute the same model.
        rms_norm_eps=1e-5,
        num_key_value_heads=s["num_attention_heads"],
        head_dim=s["qk_rope_head_dim"],
        # MLA (no RoPE, as in Kimi-Linear)
        q_lora_rank=None,
        kv_lora_rank=s["kv_lora_rank"],
        qk_nope_head_dim=s["qk_nope_head_dim"],
        qk_rope_head_dim=s["qk_rope_head_dim"],
        v_head_dim=s["v_head_dim"],
        mla_use_nope=True,
        rope_theta=10000.0,
        rope_scaling=None,
        # KDA
        linear_attn_config={
            "full_attn_layers": list(s["full_attn_layers"]),
            "head_dim": s["linear_head_dim"],
            "kda_layers": list(s["kda_layers"]),
            "num_heads": s["linear_num_heads"],
            "short_conv_kernel_size": s["linear_conv_kernel_dim"],
        },
        # MoE
        **_copied(s, "num_experts", "num_experts_per_token", "num_shared_experts", "moe_intermediate_size",
                  "first_k_dense_replace"),
        moe_layer_freq=1,
        moe_renormalize=True,
        moe_router_activation_func="sigmoid",
        routed_scaling_factor=1.0,
        use_grouped_topk=True,
        num_expert_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        num_nextn_predict_layers=0,
        model_max_length=32768,
    )
    return cfg


def model_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    if spec.family == "gdn":
        return gdn_config(spec, vocab)
    if spec.family == "kda":
        return kda_config(spec, vocab)
    raise ValueError(f"unknown model family {spec.family!r}")


def generation_config() -> dict[str, Any]:
    return {
        "bos_token_id": ENDOFTEXT_ID,
        "do_sample": False,
        "eos_token_id": [IM_END_ID, ENDOFTEXT_ID],
        "pad_token_id": PAD_ID,
    }
