"""Model checks: linear-attention layers from config.json, embedded names, tokenizer vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sglang_replayssm.bench.model import (
    ModelError,
    linear_attention_layers,
    require_linear_attention,
    resolve_model_path,
    vocab_ids,
)
from tests.support.fake_server import write_fake_model_dir


@pytest.mark.parametrize(("config", "expected"), [
    ({"layer_types": ["linear_attention", "full_attention", "linear_attention"]}, [0, 2]),
    ({"layers_block_type": ["linear_attention", "attention"]}, [0]),
    ({"full_attention_interval": 4, "num_hidden_layers": 8}, [0, 1, 2, 4, 5, 6]),
    ({"linear_attn_config": {"kda_layers": [1, 2, 4], "full_attn_layers": [3]}}, [0, 1, 3]),
    ({"text_config": {"layer_types": ["full_attention", "linear_attention"]}}, [1]),
    ({"layer_types": ["full_attention", "sliding_attention"]}, []),
    ({"model_type": "llama", "num_hidden_layers": 4}, []),
    ({"linear_attn_config": {"kda_layers": [], "full_attn_layers": [1]}}, []),
])
def test_linear_attention_layers(config: dict, expected: list[int]) -> None:
    assert linear_attention_layers(config) == expected


def test_require_linear_attention_refuses_plain_transformers(tmp_path: Path) -> None:
    hybrid = write_fake_model_dir(tmp_path / "hybrid", 50)
    assert require_linear_attention(hybrid) == [0, 1, 2]
    plain = write_fake_model_dir(tmp_path / "plain", 50, linear=False)
    with pytest.raises(ModelError, match="no linear-attention"):
        require_linear_attention(plain)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "config.json").write_text("{")
    with pytest.raises(ModelError, match="not valid JSON"):
        require_linear_attention(tmp_path / "broken")
    with pytest.raises(ModelError, match="no config.json"):
        require_linear_attention(tmp_path)


def test_resolve_model_path(tmp_path: Path) -> None:
    model = write_fake_model_dir(tmp_path / "m", 50)
    assert resolve_model_path(str(model)) == model
    with pytest.raises(ModelError, match="not a directory"):
        resolve_model_path(str(tmp_path / "missing"))


def test_embedded_name_is_built_through_make_models(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sglang_replayssm.models as models

    calls = []

    def fake_make_models(out: Path, names: list[str]) -> dict[str, Path]:
        calls.append((out, list(names)))
        return {n: write_fake_model_dir(out / n, 50) for n in names}

    monkeypatch.setattr(models, "make_models", fake_make_models)
    assert resolve_model_path("small-gdn", tmp_path) == tmp_path / "small-gdn"
    assert calls == [(tmp_path, ["small-gdn"])]


def test_real_tiny_gdn_has_linear_layers_and_a_vocabulary(tmp_path: Path) -> None:
    model = resolve_model_path("tiny-gdn", tmp_path)
    assert require_linear_attention(model)
    ids = vocab_ids(model)
    config = json.loads((model / "config.json").read_text())
    assert len(ids) > 1000 and max(ids) < config["vocab_size"]
    from transformers import AutoTokenizer

    specials = {i for i, t in AutoTokenizer.from_pretrained(str(model)).added_tokens_decoder.items() if t.special}
    assert specials and specials.isdisjoint(ids)


def test_vocab_ids_skip_special_tokens_and_ids_past_the_embedding(tmp_path: Path) -> None:
    model = write_fake_model_dir(tmp_path / "m", 60)
    assert vocab_ids(model) == list(range(2, 60))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "vocab_size": 40}))
    assert vocab_ids(model) == list(range(2, 40))
