"""The model under test: where it lives, whether it has linear-attention layers, its token ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

EMBEDDED_MODELS = ("tiny-gdn", "tiny-kda", "small-gdn")
DEFAULT_MODEL = "small-gdn"
DEFAULT_MODELS_DIR = Path.home() / ".cache" / "sglang-replayssm" / "models"


class ModelError(ValueError):
    """A model the benchmark cannot use."""


def resolve_model_path(name_or_path: str, models_dir: Path = DEFAULT_MODELS_DIR) -> Path:
    """A model directory; an embedded model's name is built (once) under ``models_dir``."""
    if name_or_path in EMBEDDED_MODELS and not Path(name_or_path).exists():
        from sglang_replayssm.models import make_models  # lazy; skips a model already built

        return Path(make_models(models_dir, names=[name_or_path])[name_or_path])
    path = Path(name_or_path).expanduser()
    if not path.is_dir():
        raise ModelError(f"model path {name_or_path!r} is not a directory (nor an embedded model: "
                         f"{', '.join(EMBEDDED_MODELS)})")
    return path


def load_config(model_dir: Path) -> dict[str, Any]:
    config_path = model_dir / "config.json"
    if not config_path.is_file():
        raise ModelError(f"{model_dir} has no config.json")
    try:
        return json.loads(config_path.read_text())
    except json.JSONDecodeError as exc:
        raise ModelError(f"{config_path} is not valid JSON: {exc}") from exc


def _configs(config: dict[str, Any]) -> list[dict[str, Any]]:
    """The top-level config and any nested language-model config (VLM wrappers)."""
    found = [config]
    for key in ("text_config", "llm_config", "language_config"):
        nested = config.get(key)
        if isinstance(nested, dict):
            found.append(nested)
    return found


def linear_attention_layers(config: dict[str, Any]) -> list[int]:
    """0-based indices of GDN/KDA (linear-attention) layers the config declares; [] for none.

    Recognised: ``layer_types``/``layers_block_type`` entries naming linear attention (Qwen3.5,
    Qwen3-Next), ``full_attention_interval`` (Qwen3-Next without ``layer_types``), and
    ``linear_attn_config.kda_layers`` (Kimi Linear, 1-based there).
    """
    for cfg in _configs(config):
        for key in ("layer_types", "layers_block_type"):
            types = cfg.get(key)
            if isinstance(types, list) and types:
                return [i for i, t in enumerate(types) if isinstance(t, str) and "linear" in t.lower()]
        lin = cfg.get("linear_attn_config")
        if isinstance(lin, dict) and isinstance(lin.get("kda_layers"), list):
            return sorted(int(i) - 1 for i in lin["kda_layers"])
        interval = cfg.get("full_attention_interval")
        n_layers = cfg.get("num_hidden_layers")
        if isinstance(interval, int) and interval > 1 and isinstance(n_layers, int):
            return [i for i in range(n_layers) if (i + 1) % interval != 0]
    return []


def require_linear_attention(model_dir: Path) -> list[int]:
    """The linear-attention layers of ``model_dir``; ModelError when it has none."""
    layers = linear_attention_layers(load_config(model_dir))
    if not layers:
        raise ModelError(
            f"{model_dir} declares no linear-attention (GDN/KDA) layers in config.json "
            "(layer_types, linear_attn_config.kda_layers or full_attention_interval); "
            "ReplaySSM and this benchmark need a hybrid linear-attention model"
        )
    return layers


def mtp_fit_prompts(model_dir: Path) -> tuple[list[list[int]], int, int]:
    """The prompts the MTP layer of the embedded model in ``model_dir`` was fitted to, with their group
    size and shared-prefix length (models/mtp.py); ModelError for a model without a fitted MTP layer."""
    from sglang_replayssm.models.mtp import FIT_PER_GROUP, FIT_PREFIX, fit_prompts
    from sglang_replayssm.models.specs import SPECS

    meta_path = model_dir / "replayssm-model.json"
    name = json.loads(meta_path.read_text()).get("name") if meta_path.is_file() else None
    spec = SPECS.get(name) if isinstance(name, str) else None
    if spec is None or not spec.mtp:
        with_mtp = ", ".join(n for n, s in SPECS.items() if s.mtp)
        raise ModelError(f"--dataset-name mtp-fit needs an embedded model with a fitted MTP layer ({with_mtp}); "
                         f"{model_dir} is {'not an embedded model' if spec is None else name}")
    vocab = next(c["vocab_size"] for c in _configs(load_config(model_dir)) if isinstance(c.get("vocab_size"), int))
    return fit_prompts(spec, vocab), FIT_PER_GROUP, FIT_PREFIX


def vocab_ids(model_dir: Path) -> list[int]:
    """Sorted ordinary token ids of the model's tokenizer that its embedding can hold."""
    from transformers import AutoTokenizer  # lazy: slow import

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), trust_remote_code=True)
    special = set(getattr(tokenizer, "all_special_ids", None) or [])
    added = getattr(tokenizer, "added_tokens_decoder", None) or {}
    special |= {i for i, tok in added.items() if getattr(tok, "special", False)}
    limit = None
    try:
        for cfg in _configs(load_config(model_dir)):
            if isinstance(cfg.get("vocab_size"), int):
                limit = cfg["vocab_size"]
                break
    except ModelError:
        pass
    ids = sorted({i for i in tokenizer.get_vocab().values() if isinstance(i, int)} - special)
    if limit is not None:
        ids = [i for i in ids if i < limit]
    if len(ids) < 2:
        raise ModelError(f"the tokenizer of {model_dir} has fewer than 2 ordinary token ids")
    return ids
