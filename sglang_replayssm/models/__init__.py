"""Embedded test models: tiny/small random-weight GDN and KDA hybrids, built offline and deterministically.

``make_models(out)`` writes one normal Hugging Face model directory per name:

* ``tiny-gdn``: Qwen3.5 text model (``Qwen3_5ForCausalLM``, model_type ``qwen3_5_text``), hidden 64,
  layers [GDN, full, GDN, full], linear key/value head dims 32.
* ``tiny-kda``: Kimi-Linear (``KimiLinearForCausalLM``), hidden 64, layers [KDA, MLA, KDA, MLA],
  KDA head dim 32, a dense layer 0 then a small sigmoid-routed MoE (4 experts, top 2, one shared).
* ``small-gdn``: a larger Qwen3.5 GDN hybrid (hidden 512, 8 layers, 3 GDN : 1 full attention) whose
  cold 2048-token prefill costs far more than a cached 64-token tail on a small CPU
  (``lab/scripts/measure_small_gdn_prefill.py`` measures the ratio).

Built only when named (``REAL_SHAPE_NAMES``, not in ``MODEL_NAMES``: about 0.5 B parameters and 1 GB
each, for GPU machines), bfloat16 on disk (``ModelSpec.weight_dtype``):

* ``qnext-gdn``: Qwen3.5 text GDN hybrid at Qwen3-Next's layer shapes: hidden 2048, 8 layers
  [GDN, GDN, GDN, full] x 2, GDN with 16 key / 32 value heads of dim 128 (conv 4), full attention with
  16 query / 2 KV heads of dim 256, dense MLP 5120.
* ``kimi-kda``: Kimi-Linear KDA hybrid at Kimi-Linear's KDA shape: hidden 2048, 8 layers
  [KDA, KDA, KDA, MLA] x 2, KDA with 32 heads of dim 128 (conv 4), MLA with 16 heads (kv_lora_rank 512,
  qk_nope 128, qk_rope 64, v 128), and no MoE layer (first_k_dense_replace = 8: every MLP dense, 5120).

Both real-shape models draw their linear-attention decay gates by Mamba's recipe
(``ModelSpec.memory_init = "mamba"``: dt log-uniform in [1e-3, 1e-1], A in U(1, 16), the gate's input
projection scaled to RMS 0.5), so their heads remember ~1 to ~1000 tokens and a served state that is
wrong changes the output (transformers' GDN init forgets within a token or two).

Everything is seeded: two builds give byte-identical files. The default models are float32. Each directory holds
``config.json``, ``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json`` (with a ChatML chat template) and a marker file (``MARKER``) recording the
builder version, a hash of the spec and a hash of the contents; a directory whose marker matches is
not rebuilt. Directories are written to a temporary sibling and renamed into place.

The shared tokenizer is a byte-level BPE trained locally (``tokenizers``) on a synthetic English-like
corpus (``synthetic_sentences``) generated from a seeded word list. The lm_head rows of the special
tokens are zero, so greedy decoding never picks them (no early EOS on random weights).

Config keys SGLang 0.5.23 needs beyond what transformers writes:

* Qwen3.5: ``full_attention_interval`` (SGLang's ``Qwen3NextConfig.layers_block_type`` derives the
  layer pattern from it and ignores ``layer_types``) and top-level ``rope_theta``.
* Kimi-Linear: the checkpoint-style keys SGLang's ``KimiLinearConfig`` reads (``linear_attn_config``
  with 1-based ``kda_layers``/``full_attn_layers``, ``num_experts``, ``num_experts_per_token``,
  ``first_k_dense_replace``, ``moe_layer_freq``, ``num_shared_experts``, ``mla_use_nope``...);
  transformers reads the same keys through its attribute map. Weights use the checkpoint names
  (``block_sparse_moe.experts.N.w1/w2/w3``, ``q/k/v_conv1d``, ``self_attn.f_a_proj``...), except that
  the dense layer-0 MLP is ``mlp.*`` (transformers would save it as ``block_sparse_moe.*``).
"""

from __future__ import annotations

from sglang_replayssm.models.build import (
    _build_into,
    build_model,
    is_complete,
    main,
    make_models,
    read_marker,
)
from sglang_replayssm.models.configs import gdn_config, generation_config, kda_config, model_config
from sglang_replayssm.models.corpus import (
    synthetic_sentences,
    synthetic_text,
    synthetic_words,
    tokenizer_vocab_size,
)
from sglang_replayssm.models.specs import (
    BUILDER_VERSION,
    CHAT_TEMPLATE,
    CORPUS_SEED,
    CORPUS_SENTENCES,
    DEFAULT_OUT,
    ENDOFTEXT_ID,
    IM_END_ID,
    IM_START_ID,
    MARKER,
    MODEL_NAMES,
    PAD_ID,
    REAL_SHAPE_NAMES,
    SPECIAL_TOKENS,
    SPECS,
    TOKENIZER_VOCAB,
    WEIGHT_DTYPES,
    WEIGHTS_FILE,
    ModelSpec,
)
from sglang_replayssm.models.weights import _hf_model, hf_config_class, hf_model_class

__all__ = [
    "BUILDER_VERSION", "CHAT_TEMPLATE", "CORPUS_SEED", "CORPUS_SENTENCES", "DEFAULT_OUT", "ENDOFTEXT_ID",
    "IM_END_ID", "IM_START_ID", "MARKER", "MODEL_NAMES", "PAD_ID", "REAL_SHAPE_NAMES", "SPECIAL_TOKENS", "SPECS", "TOKENIZER_VOCAB",
    "WEIGHT_DTYPES", "WEIGHTS_FILE", "ModelSpec", "_build_into", "_hf_model", "build_model", "gdn_config", "generation_config",
    "hf_config_class", "hf_model_class", "is_complete", "kda_config", "main", "make_models", "model_config",
    "read_marker", "synthetic_sentences", "synthetic_text", "synthetic_words", "tokenizer_vocab_size",
]
