"""What the embedded models are: builder version, file names, tokenizer constants and one ModelSpec per name."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

BUILDER_VERSION = 2  # bump whenever a config or weight recipe changes
MARKER = "replayssm-model.json"
# What make-models / make bench / the tests build by default. The real-shape models (REAL_SHAPE_NAMES:
# Qwen3-Next's / Kimi-Linear's linear-attention layer shapes, about 0.5 B parameters each) are built
# only when named (make-models --names qnext-gdn): a GPU machine's job, not a 2-core CI machine's.
MODEL_NAMES: tuple[str, ...] = ("tiny-gdn", "tiny-kda", "small-gdn")
REAL_SHAPE_NAMES: tuple[str, ...] = ("qnext-gdn", "kimi-kda", "qnext-gdn-24", "kimi-kda-24")
WEIGHT_DTYPES: tuple[str, ...] = ("float32", "bfloat16")
MEMORY_INITS: tuple[str, ...] = ("mamba",)
DEFAULT_OUT = Path.home() / ".cache" / "sglang-replayssm" / "models"

# Tokenizer
TOKENIZER_VOCAB = 2048
CORPUS_SEED = 20240611
CORPUS_SENTENCES = 24000
SPECIAL_TOKENS: tuple[str, ...] = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|pad|>")
ENDOFTEXT_ID, IM_START_ID, IM_END_ID, PAD_ID = 0, 1, 2, 3
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' -}}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
)

WEIGHTS_FILE = "model.safetensors"
_MODEL_FILES = ("config.json", "generation_config.json", WEIGHTS_FILE, "tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class ModelSpec:
    """What to build: an architecture family, its shape and the weight seed."""

    name: str
    family: str  # "gdn" (Qwen3.5 text) or "kda" (Kimi-Linear)
    seed: int
    shape: dict[str, Any] = field(default_factory=dict)
    init_std: float = 0.02
    norm_noise: float = 0.1  # std of noise added to norm weights / router bias (so wrong norms show)
    mtp: bool = False  # an MTP draft layer under mtp.* (models/mtp.py), for NEXTN speculative decoding
    weight_dtype: str = "float32"  # dtype of the weights on disk and of config.json's torch_dtype/dtype
    # How the linear-attention decay gates are drawn. None: as transformers' init leaves them (GDN: A in
    # U(0.01, 16), dt_bias = 1, so most heads forget their state within a token or two). "mamba": Mamba's
    # recipe (weights.py, _memory_init): per gate channel dt log-uniform in [1e-3, 1e-1], dt_bias its
    # inverse softplus, A in U(1, 16), and the gate's input projection scaled down so that
    # softplus(a + dt_bias) stays near dt: per-token decays exp(-A * dt) from ~0.2 to ~0.999.
    memory_init: str | None = None

    def spec_hash(self) -> str:
        fields = {"builder": BUILDER_VERSION, "name": self.name, "family": self.family, "seed": self.seed,
                  "shape": self.shape, "init_std": self.init_std, "norm_noise": self.norm_noise,
                  "tokenizer": [TOKENIZER_VOCAB, CORPUS_SEED, CORPUS_SENTENCES, list(SPECIAL_TOKENS), CHAT_TEMPLATE]}
        if self.mtp:  # only then: the other models keep their hashes (and their built copies)
            fields["mtp"] = 1
        if self.weight_dtype != "float32":  # likewise
            fields["weight_dtype"] = self.weight_dtype
        if self.memory_init is not None:  # likewise
            fields["memory_init"] = self.memory_init
        blob = json.dumps(fields, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()


SPECS: dict[str, ModelSpec] = {
    "tiny-gdn": ModelSpec(
        name="tiny-gdn",
        family="gdn",
        seed=1001,
        init_std=0.08,
        mtp=True,
        shape={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "full_attention_interval": 2,  # [GDN, full, GDN, full]
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 32,
            "linear_num_key_heads": 2,
            "linear_num_value_heads": 4,
            "linear_key_head_dim": 32,
            "linear_value_head_dim": 32,
            "linear_conv_kernel_dim": 4,
        },
    ),
    "tiny-kda": ModelSpec(
        name="tiny-kda",
        family="kda",
        seed=1002,
        init_std=0.15,  # at 0.08 greedy output often collapses into repeats
        shape={
            "hidden_size": 64,
            "intermediate_size": 128,
            "num_hidden_layers": 4,
            "kda_layers": [1, 3],  # 1-based, as in Kimi checkpoints: [KDA, MLA, KDA, MLA]
            "full_attn_layers": [2, 4],
            "linear_num_heads": 2,
            "linear_head_dim": 32,
            "linear_conv_kernel_dim": 4,
            "num_attention_heads": 4,
            # MLA: kv_lora_rank + qk_rope_head_dim = 288, a shape SGLang's Triton MLA kernels special-case
            "kv_lora_rank": 256,
            "qk_nope_head_dim": 32,
            "qk_rope_head_dim": 32,
            "v_head_dim": 32,
            "num_experts": 4,
            "num_experts_per_token": 2,
            "num_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 1,
        },
    ),
    "small-gdn": ModelSpec(
        name="small-gdn",
        family="gdn",
        seed=1003,
        init_std=0.03,
        shape={
            "hidden_size": 512,
            "intermediate_size": 1536,
            "num_hidden_layers": 8,
            "full_attention_interval": 4,  # [GDN, GDN, GDN, full] x 2
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "head_dim": 64,
            "linear_num_key_heads": 4,
            "linear_num_value_heads": 8,
            "linear_key_head_dim": 64,
            "linear_value_head_dim": 64,
            "linear_conv_kernel_dim": 4,
        },
    ),
    # The real-shape models (REAL_SHAPE_NAMES): not built by default, bfloat16 on disk.
    "qnext-gdn": ModelSpec(
        name="qnext-gdn",
        family="gdn",
        seed=1004,
        # at 0.02 (transformers' default) the logits are nearly flat (std 0.9, entropy 7.2 of 7.6 nats);
        # at 0.05 std 2.2, entropy 3-5 nats, median top-2 gap 0.5, and 48 greedy tokens without a repeat
        init_std=0.05,
        weight_dtype="bfloat16",
        memory_init="mamba",  # transformers' GDN decay init forgets within a token or two
        shape={
            # Qwen3-Next's linear-attention (GDN) and full-attention layer shapes, at 8 layers with a
            # dense MLP: [GDN, GDN, GDN, full] x 2
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": 8,
            "full_attention_interval": 4,
            "num_attention_heads": 16,
            "num_key_value_heads": 2,
            "head_dim": 256,
            "linear_num_key_heads": 16,
            "linear_num_value_heads": 32,
            "linear_key_head_dim": 128,
            "linear_value_head_dim": 128,
            "linear_conv_kernel_dim": 4,
        },
    ),
    "kimi-kda": ModelSpec(
        name="kimi-kda",
        family="kda",
        seed=1005,
        init_std=0.05,  # as qnext-gdn (at 0.02 two prompts began with the same greedy token)
        weight_dtype="bfloat16",
        # transformers already draws Mamba's dt/A for KDA; "mamba" redraws them from the spec's seed and
        # scales f_b_proj so the gate input f_b(f_a(x)) has RMS 0.5 (about 1.3 at init_std 0.05)
        memory_init="mamba",
        shape={
            # Kimi-Linear's KDA layer shape, at 8 layers: [KDA, KDA, KDA, MLA] x 2
            "hidden_size": 2048,
            "intermediate_size": 5120,
            "num_hidden_layers": 8,
            "kda_layers": [1, 2, 3, 5, 6, 7],  # 1-based
            "full_attn_layers": [4, 8],
            "linear_num_heads": 32,
            "linear_head_dim": 128,
            "linear_conv_kernel_dim": 4,
            "num_attention_heads": 16,
            # MLA at DeepSeek-V3's / Kimi-Linear's head shape: kv_lora_rank + qk_rope_head_dim = 576 and
            # qk_nope + qk_rope = 192, both special-cased in SGLang's Triton MLA kernels
            "kv_lora_rank": 512,
            "qk_nope_head_dim": 128,
            "qk_rope_head_dim": 64,
            "v_head_dim": 128,
            # No MoE layer: first_k_dense_replace = num_hidden_layers makes every layer's MLP dense (in
            # SGLang and transformers alike). The expert fields stay (both config classes read them).
            "num_experts": 4,
            "num_experts_per_token": 2,
            "num_shared_experts": 1,
            "moe_intermediate_size": 32,
            "first_k_dense_replace": 8,
        },
    ),
}
# qnext-gdn at 24 layers ([GDN, GDN, GDN, full] x 6, about 1.4 B parameters): on the lab H200 an 8-layer
# decode step at 256 requests is host-bound (GPU ~3 ms of a ~5 ms step); at 24 layers the GPU's share of
# the step is what a real 48-layer Qwen3-Next sees, so decode tokens/s compares the kernels.
SPECS["qnext-gdn-24"] = replace(SPECS["qnext-gdn"], name="qnext-gdn-24",
                                shape={**SPECS["qnext-gdn"].shape, "num_hidden_layers": 24})
# kimi-kda at 24 layers ([KDA, KDA, KDA, MLA] x 6, dense MLPs): the KDA twin of qnext-gdn-24.
SPECS["kimi-kda-24"] = replace(SPECS["kimi-kda"], name="kimi-kda-24", shape={
    **SPECS["kimi-kda"].shape, "num_hidden_layers": 24, "first_k_dense_replace": 24,
    "kda_layers": [i for i in range(1, 25) if i % 4], "full_attn_layers": list(range(4, 25, 4))})
