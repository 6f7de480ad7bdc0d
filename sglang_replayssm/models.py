"""Embedded test models: tiny/small random-weight GDN and KDA hybrids, built offline and deterministically.

``make_models(out)`` writes one normal Hugging Face model directory per name:

* ``tiny-gdn``: Qwen3.5 text model (``Qwen3_5ForCausalLM``, model_type ``qwen3_5_text``), hidden 64,
  layers [GDN, full, GDN, full], linear key/value head dims 32.
* ``tiny-kda``: Kimi-Linear (``KimiLinearForCausalLM``), hidden 64, layers [KDA, MLA, KDA, MLA],
  KDA head dim 32, a dense layer 0 then a small sigmoid-routed MoE (4 experts, top 2, one shared).
* ``small-gdn``: a larger Qwen3.5 GDN hybrid (hidden 512, 8 layers, 3 GDN : 1 full attention) whose
  cold 2048-token prefill costs far more than a cached 64-token tail on a small CPU
  (``scripts/measure_small_gdn_prefill.py`` measures the ratio).

Everything is float32 and seeded: two builds give byte-identical files. Each directory holds
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

import argparse
import contextlib
import fcntl
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

BUILDER_VERSION = 2  # bump whenever a config or weight recipe changes
MARKER = "replayssm-model.json"
MODEL_NAMES: tuple[str, ...] = ("tiny-gdn", "tiny-kda", "small-gdn")
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

    def spec_hash(self) -> str:
        blob = json.dumps(
            {"builder": BUILDER_VERSION, "name": self.name, "family": self.family, "seed": self.seed,
             "shape": self.shape, "init_std": self.init_std, "norm_noise": self.norm_noise,
             "tokenizer": [TOKENIZER_VOCAB, CORPUS_SEED, CORPUS_SENTENCES, list(SPECIAL_TOKENS), CHAT_TEMPLATE]},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()


SPECS: dict[str, ModelSpec] = {
    "tiny-gdn": ModelSpec(
        name="tiny-gdn",
        family="gdn",
        seed=1001,
        init_std=0.08,
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
}


# ---------------------------------------------------------------------------------------------
# Synthetic corpus and tokenizer
# ---------------------------------------------------------------------------------------------

_FUNCTION_WORDS = (
    "the of and to a in is that it for on was with as by at from this be are or an which not have "
    "has had but they we you he she his her their its our one all can will would there what when "
    "who how more some into than then so if no about up out only other also after new first two "
    "may these could most over such very just where must through each much before do does did "
    "under between while because both few many same well"
).split()
_CONTENT_WORDS = (
    "river stone garden window market letter morning city water light house paper table road "
    "winter summer forest mountain village harbor engine signal number system model cache prefix "
    "token layer state memory server request answer question document report story reader "
    "teacher student doctor farmer builder library kitchen bridge valley island ocean cloud "
    "rain wind fire metal glass silver golden quiet bright small large early late simple careful "
    "ancient modern open closed green blue red white black north south east west walk read write "
    "build carry follow remember measure compare describe explain travel gather notice improve"
).split()
_ONSETS = ("", "b", "bl", "br", "c", "ch", "cl", "d", "dr", "f", "fl", "fr", "g", "gl", "gr", "h", "j", "k",
           "l", "m", "n", "p", "pl", "pr", "qu", "r", "s", "sc", "sh", "sl", "sp", "st", "t", "th", "tr",
           "v", "w", "wh", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oa", "oo", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rd", "rt", "x", "sh", "th")
_SUFFIXES = ("", "", "", "", "s", "ed", "ing", "er", "ly", "ion", "ness", "ment", "able")


@lru_cache(maxsize=4)
def synthetic_words(seed: int = CORPUS_SEED, n_generated: int = 1800) -> tuple[str, ...]:
    """A fixed English-like lexicon: common words first, then seeded pseudo-words (rank order)."""
    rng = random.Random(seed)
    words: list[str] = list(_FUNCTION_WORDS) + list(_CONTENT_WORDS)
    seen = set(words)
    while len(words) < len(_FUNCTION_WORDS) + len(_CONTENT_WORDS) + n_generated:
        n_syll = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n_syll))
        word += rng.choice(_SUFFIXES)
        if 2 <= len(word) <= 14 and word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


def synthetic_sentences(n: int, seed: int = CORPUS_SEED) -> Iterator[str]:
    """``n`` deterministic English-like sentences (Zipf-distributed words, punctuation, numbers)."""
    words = synthetic_words()
    weights = [1.0 / (rank + 1) ** 1.05 for rank in range(len(words))]
    cum: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)
    rng = random.Random(seed + 1)
    for _ in range(n):
        length = rng.randint(4, 18)
        picked = rng.choices(words, cum_weights=cum, k=length)
        parts: list[str] = []
        for i, word in enumerate(picked):
            if rng.random() < 0.03:
                word = str(rng.randint(0, 2024))
            if i == 0:
                word = word[:1].upper() + word[1:]
            elif rng.random() < 0.05:
                word = word[:1].upper() + word[1:]
            parts.append(word)
            if i < length - 1 and rng.random() < 0.08:
                parts[-1] += ","
        end = rng.choices((".", "?", "!", ":"), weights=(85, 8, 4, 3))[0]
        yield " ".join(parts) + end


def synthetic_text(n_sentences: int, seed: int = CORPUS_SEED) -> str:
    """Paragraphs of ``synthetic_sentences`` (for prompts that tokenize like the training corpus)."""
    rng = random.Random(seed + 2)
    out: list[str] = []
    for sentence in synthetic_sentences(n_sentences, seed):
        out.append(sentence)
        out.append("\n\n" if rng.random() < 0.15 else " ")
    return "".join(out).rstrip()


def _corpus_lines() -> Iterator[str]:
    rng = random.Random(CORPUS_SEED + 3)
    batch: list[str] = []
    for sentence in synthetic_sentences(CORPUS_SENTENCES):
        batch.append(sentence)
        if len(batch) >= rng.randint(3, 8):
            yield " ".join(batch)
            batch = []
    if batch:
        yield " ".join(batch)
    # a few chat-shaped samples so role names and newlines merge sensibly
    for i, sentence in enumerate(synthetic_sentences(400, CORPUS_SEED + 4)):
        role = ("system", "user", "assistant")[i % 3]
        yield f"{role}\n{sentence}\n"


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """The trained tokenizer, serialized (tokenizer.json contents); deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token))
    return tok.to_str(pretty=True)


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|pad|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def tokenizer_vocab_size() -> int:
    return len(json.loads(_tokenizer_json())["model"]["vocab"])


# ---------------------------------------------------------------------------------------------
# Configs
# ---------------------------------------------------------------------------------------------

def _common_config(vocab: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab,
        "torch_dtype": "float32",
        "dtype": "float32",
        "bos_token_id": ENDOFTEXT_ID,
        "eos_token_id": IM_END_ID,
        "pad_token_id": PAD_ID,
        "tie_word_embeddings": False,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
        "use_cache": True,
        "max_position_embeddings": 32768,
    }


def gdn_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    """config.json of a Qwen3.5 text GDN hybrid (read by transformers and SGLang alike)."""
    s = spec.shape
    n_layers = s["num_hidden_layers"]
    interval = s["full_attention_interval"]
    layer_types = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(n_layers)]
    cfg = _common_config(vocab)
    cfg.update(
        architectures=["Qwen3_5ForCausalLM"],
        model_type="qwen3_5_text",
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=n_layers,
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_key_value_heads"],
        head_dim=s["head_dim"],
        attention_bias=False,
        attention_dropout=0.0,
        full_attention_interval=interval,
        layer_types=layer_types,
        linear_conv_kernel_dim=s["linear_conv_kernel_dim"],
        linear_key_head_dim=s["linear_key_head_dim"],
        linear_value_head_dim=s["linear_value_head_dim"],
        linear_num_key_heads=s["linear_num_key_heads"],
        linear_num_value_heads=s["linear_num_value_heads"],
        initializer_range=spec.init_std,
        partial_rotary_factor=0.25,
        rope_theta=10000.0,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25},
    )
    return cfg


def kda_config(spec: ModelSpec, vocab: int) -> dict[str, Any]:
    """config.json of a Kimi-Linear KDA hybrid, in the checkpoint layout both libraries read."""
    s = spec.shape
    cfg = _common_config(vocab)
    cfg.update(
        architectures=["KimiLinearForCausalLM"],
        model_type="kimi_linear",
        # SGLang 0.5.23's KimiDeltaAttention never passes config.rms_norm_eps to its o_norm (it keeps
        # its 1e-5 default); HF reads the config. Use 1e-5 so both libraries compute the same model.
        rms_norm_eps=1e-5,
        hidden_size=s["hidden_size"],
        intermediate_size=s["intermediate_size"],
        num_hidden_layers=s["num_hidden_layers"],
        num_attention_heads=s["num_attention_heads"],
        num_key_value_heads=s["num_attention_heads"],
        head_dim=s["qk_rope_head_dim"],
        attention_bias=False,
        attention_dropout=0.0,
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
        num_experts=s["num_experts"],
        num_experts_per_token=s["num_experts_per_token"],
        num_shared_experts=s["num_shared_experts"],
        moe_intermediate_size=s["moe_intermediate_size"],
        first_k_dense_replace=s["first_k_dense_replace"],
        moe_layer_freq=1,
        moe_renormalize=True,
        moe_router_activation_func="sigmoid",
        routed_scaling_factor=1.0,
        use_grouped_topk=True,
        num_expert_group=1,
        topk_group=1,
        topk_method="noaux_tc",
        num_nextn_predict_layers=0,
        initializer_range=spec.init_std,
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


# ---------------------------------------------------------------------------------------------
# Weights
# ---------------------------------------------------------------------------------------------

def hf_model_class(family: str) -> type:
    """The transformers class of a family (imported explicitly, not through AutoModel)."""
    if family == "gdn":
        from transformers import Qwen3_5ForCausalLM

        return Qwen3_5ForCausalLM
    if family == "kda":
        from transformers import KimiLinearForCausalLM

        return KimiLinearForCausalLM
    raise ValueError(f"unknown model family {family!r}")


def hf_config_class(family: str) -> type:
    if family == "gdn":
        from transformers import Qwen3_5TextConfig

        return Qwen3_5TextConfig
    if family == "kda":
        from transformers import KimiLinearConfig

        return KimiLinearConfig
    raise ValueError(f"unknown model family {family!r}")


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


# ---------------------------------------------------------------------------------------------
# Build
# ---------------------------------------------------------------------------------------------

def _write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _build_into(spec: ModelSpec, dest: Path) -> dict[str, Any]:
    """Write every file of ``spec`` into the (empty) directory ``dest``; returns the marker."""
    from safetensors.torch import save_file

    vocab = tokenizer_vocab_size()
    cfg = model_config(spec, vocab)
    model = _hf_model(spec, cfg)
    sd = _checkpoint_state_dict(spec, model)
    save_file({k: sd[k] for k in sorted(sd)}, str(dest / WEIGHTS_FILE), metadata={"format": "pt"})
    _write_json(dest / "config.json", cfg)
    _write_json(dest / "generation_config.json", generation_config())
    (dest / "tokenizer.json").write_text(_tokenizer_json())
    _write_json(dest / "tokenizer_config.json", _tokenizer_config())
    for name in _MODEL_FILES:
        os.chmod(dest / name, 0o644)
    files = {name: _sha256_file(dest / name) for name in _MODEL_FILES}
    content = hashlib.sha256(json.dumps(files, sort_keys=True).encode()).hexdigest()
    n_params = sum(int(t.numel()) for t in sd.values())
    marker = {
        "builder_version": BUILDER_VERSION,
        "name": spec.name,
        "spec_hash": spec.spec_hash(),
        "content_hash": content,
        "files": {name: {"sha256": digest, "size": (dest / name).stat().st_size} for name, digest in files.items()},
        "num_parameters": n_params,
    }
    _write_json(dest / MARKER, marker)
    return marker


def read_marker(model_dir: Path) -> dict[str, Any] | None:
    """The marker of a built embedded model, or None."""
    try:
        return json.loads((Path(model_dir) / MARKER).read_text())
    except (OSError, json.JSONDecodeError):
        return None


def is_complete(model_dir: Path, spec: ModelSpec, verify_hashes: bool = False) -> bool:
    """Whether ``model_dir`` holds a complete build of ``spec`` by this builder version."""
    marker = read_marker(model_dir)
    if not marker or marker.get("builder_version") != BUILDER_VERSION or marker.get("spec_hash") != spec.spec_hash():
        return False
    for name in _MODEL_FILES:
        info = marker.get("files", {}).get(name)
        path = Path(model_dir) / name
        if not info or not path.is_file() or path.stat().st_size != info.get("size"):
            return False
        if verify_hashes and _sha256_file(path) != info.get("sha256"):
            return False
    return True


@contextlib.contextmanager
def _lock(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build_model(spec: ModelSpec, out: Path, force: bool = False, log: Any = print) -> Path:
    """Build ``spec`` as ``out/<name>`` unless a complete same-version copy is already there."""
    out = Path(out)
    target = out / spec.name
    with _lock(out / f".{spec.name}.lock"):
        if not force and is_complete(target, spec):
            log(f"[make-models] {spec.name}: up to date at {target}")
            return target
        t0 = time.monotonic()
        log(f"[make-models] {spec.name}: building ({spec.family}, {spec.shape.get('hidden_size')} hidden, "
            f"{spec.shape.get('num_hidden_layers')} layers) ...")
        tmp = Path(tempfile.mkdtemp(prefix=f".{spec.name}.tmp-", dir=out))
        try:
            marker = _build_into(spec, tmp)
            os.chmod(tmp, 0o755)
            if target.exists():
                trash = Path(tempfile.mkdtemp(prefix=f".{spec.name}.old-", dir=out))
                os.rename(target, trash / spec.name)
                os.rename(tmp, target)
                shutil.rmtree(trash, ignore_errors=True)
            else:
                os.rename(tmp, target)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        size = sum(info["size"] for info in marker["files"].values())
        log(f"[make-models] {spec.name}: {marker['num_parameters'] / 1e6:.2f} M params, {size / 1e6:.1f} MB, "
            f"{time.monotonic() - t0:.1f} s -> {target}")
        return target


def make_models(out: Path = DEFAULT_OUT, names: Iterable[str] = MODEL_NAMES, force: bool = False,
                log: Any = print) -> dict[str, Path]:
    """Build the named embedded models under ``out``; returns name -> model directory."""
    names = list(names)
    unknown = [n for n in names if n not in SPECS]
    if unknown:
        raise ValueError(f"unknown model name(s) {unknown}; known: {', '.join(SPECS)}")
    Path(out).mkdir(parents=True, exist_ok=True)
    return {name: build_model(SPECS[name], Path(out), force=force, log=log) for name in names}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="sglang-replayssm make-models", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    parser.add_argument("--names", nargs="+", choices=list(SPECS), default=list(MODEL_NAMES),
                        help="which models to build (default: all)")
    parser.add_argument("--force", action="store_true", help="rebuild even when an up-to-date copy exists")
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    built = make_models(args.out, args.names, force=args.force)
    for name, path in built.items():
        print(f"{name}\t{path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
