"""The real-shape embedded models (qnext-gdn, kimi-kda): their specs, configs and build path, checked on a
CPU without building them (each is about 0.5 B parameters, 1 GB in bfloat16: a GPU machine's build, not
CI's). The configs are written at full size; the build runs on shrunk copies of the specs (same code
path, tiny sizes); the full-size models are constructed on the meta device only."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_replayssm import models as M
from sglang_replayssm.models import build as build_mod
from sglang_replayssm.models.weights import _checkpoint_state_dict

REPO = Path(__file__).resolve().parents[1]
REAL = ("qnext-gdn", "kimi-kda")

# spec_hash() of the default models before the weight_dtype field existed (builder version 2): adding
# fields to ModelSpec must not change them (their built copies stay valid and byte-identical).
EXISTING_HASHES = {
    "tiny-gdn": "cea066fd096bdc5aeee8b1fb6c116f83e70977e9afca22326c9c86b440adf47e",
    "tiny-kda": "8a5e8efa3cb44d1a578eb88e4e77ed12a212b20c829c55b52e0cb9af25f44ddb",
    "small-gdn": "97f0dc643c09ac654dda2830e288f872d75b815b15d4a2de8c524db5093394f0",
}


def _quiet(msg: str) -> None:
    pass


def _shrunk(name: str) -> M.ModelSpec:
    """``SPECS[name]`` at tiny widths: same family, seed, init, dtype and layer pattern (8 layers)."""
    spec = M.SPECS[name]
    small: dict[str, Any] = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4}
    if spec.family == "gdn":
        small.update(num_key_value_heads=2, head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
                     linear_key_head_dim=16, linear_value_head_dim=16)
    else:
        small.update(linear_num_heads=4, linear_head_dim=16, kv_lora_rank=32, qk_nope_head_dim=16,
                     qk_rope_head_dim=8, v_head_dim=16)
    assert set(small) <= set(spec.shape)
    return dataclasses.replace(spec, name=f"{name}-shrunk", shape={**spec.shape, **small})


def _layer_kinds(cfg: dict[str, Any]) -> list[str]:
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] == "kimi_linear":
        kda = set(cfg["linear_attn_config"]["kda_layers"])
        return ["linear" if i + 1 in kda else "full" for i in range(n)]
    return ["full" if (i + 1) % cfg["full_attention_interval"] == 0 else "linear" for i in range(n)]


# --- names and hashes ------------------------------------------------------------------------


def test_real_shape_models_are_built_only_when_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert M.REAL_SHAPE_NAMES == (*REAL, "qnext-gdn-24", "kimi-kda-24")
    assert all(name in M.SPECS for name in REAL) and not set(REAL) & set(M.MODEL_NAMES)
    asked: list[list[str]] = []

    def fake_make_models(out: Path, names: list[str], force: bool = False) -> dict[str, Path]:
        asked.append(list(names))
        return {}

    monkeypatch.setattr(build_mod, "make_models", fake_make_models)
    assert M.main(["--out", str(tmp_path)]) == 0
    assert M.main(["--out", str(tmp_path), "--names", "qnext-gdn", "kimi-kda"]) == 0
    assert asked == [list(M.MODEL_NAMES), ["qnext-gdn", "kimi-kda"]]


def test_the_deep_gdn_model_is_qnext_gdn_at_24_layers() -> None:
    deep, base = M.SPECS["qnext-gdn-24"], M.SPECS["qnext-gdn"]
    assert deep.shape == {**base.shape, "num_hidden_layers": 24} and deep.spec_hash() != base.spec_hash()
    assert dataclasses.replace(deep, name=base.name, shape=base.shape) == base
    kinds = _layer_kinds(M.model_config(deep, 2048))
    assert kinds.count("linear") == 18 and kinds.count("full") == 6


def test_the_deep_kda_model_is_kimi_kda_at_24_layers_three_kda_to_one_mla() -> None:
    deep, base = M.SPECS["kimi-kda-24"], M.SPECS["kimi-kda"]
    assert deep.spec_hash() != base.spec_hash() and deep.family == base.family == "kda"
    kinds = _layer_kinds(M.model_config(deep, 2048))
    assert kinds == ["linear", "linear", "linear", "full"] * 6
    assert M.model_config(deep, 2048)["first_k_dense_replace"] == 24


def test_existing_spec_hashes_are_unchanged() -> None:
    assert {name: M.SPECS[name].spec_hash() for name in EXISTING_HASHES} == EXISTING_HASHES
    assert set(EXISTING_HASHES) == set(M.MODEL_NAMES)
    for name in EXISTING_HASHES:
        spec = M.SPECS[name]
        assert spec.weight_dtype == "float32"
        assert dataclasses.replace(spec, weight_dtype="float32").spec_hash() == spec.spec_hash()
        assert dataclasses.replace(spec, weight_dtype="bfloat16").spec_hash() != spec.spec_hash()
        assert spec.memory_init is None
        assert dataclasses.replace(spec, memory_init="mamba").spec_hash() != spec.spec_hash()
    for name in REAL:
        spec = M.SPECS[name]
        assert spec.weight_dtype == "bfloat16" and not spec.mtp
        assert dataclasses.replace(spec, weight_dtype="float32").spec_hash() != spec.spec_hash()
        assert spec.memory_init == "mamba"
        assert dataclasses.replace(spec, memory_init=None).spec_hash() != spec.spec_hash()


# --- configs at full size ---------------------------------------------------------------------


def test_full_size_configs() -> None:
    gdn = M.model_config(M.SPECS["qnext-gdn"], 2048)
    assert gdn["torch_dtype"] == gdn["dtype"] == "bfloat16"
    assert gdn["architectures"] == ["Qwen3_5ForCausalLM"] and gdn["model_type"] == "qwen3_5_text"
    assert _layer_kinds(gdn) == ["linear", "linear", "linear", "full"] * 2
    assert ["linear" if t == "linear_attention" else "full" for t in gdn["layer_types"]] == _layer_kinds(gdn)
    assert (gdn["linear_num_key_heads"], gdn["linear_num_value_heads"], gdn["linear_key_head_dim"],
            gdn["linear_value_head_dim"], gdn["linear_conv_kernel_dim"]) == (16, 32, 128, 128, 4)
    assert (gdn["hidden_size"], gdn["intermediate_size"], gdn["num_hidden_layers"]) == (2048, 5120, 8)
    assert (gdn["num_attention_heads"], gdn["num_key_value_heads"], gdn["head_dim"]) == (16, 2, 256)

    kda = M.model_config(M.SPECS["kimi-kda"], 2048)
    assert kda["torch_dtype"] == kda["dtype"] == "bfloat16"
    assert kda["architectures"] == ["KimiLinearForCausalLM"] and kda["model_type"] == "kimi_linear"
    assert _layer_kinds(kda) == ["linear", "linear", "linear", "full"] * 2
    lin = kda["linear_attn_config"]
    assert (lin["num_heads"], lin["head_dim"], lin["short_conv_kernel_size"]) == (32, 128, 4)
    assert lin["kda_layers"] == [1, 2, 3, 5, 6, 7] and lin["full_attn_layers"] == [4, 8]
    assert (kda["hidden_size"], kda["intermediate_size"], kda["num_hidden_layers"]) == (2048, 5120, 8)
    assert kda["kv_lora_rank"] + kda["qk_rope_head_dim"] == 576  # DeepSeek's MLA decode shape
    assert kda["qk_nope_head_dim"] + kda["qk_rope_head_dim"] == 192 and kda["v_head_dim"] == 128
    assert kda["first_k_dense_replace"] == kda["num_hidden_layers"]  # no MoE layer
    hf = M.hf_config_class("kda").from_dict(dict(kda))
    assert hf.mlp_layer_types == ["dense"] * 8


_SGLANG_CONFIG_CHECK = r"""
import json, sys
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.srt.configs.qwen3_5 import Qwen3_5TextConfig
from sglang.srt.models.kimi_linear import _is_sparse_layer
from sglang.srt.runtime_context import get_parallel
get_parallel().override_permanently(attn_tp_size=1, tp_size=1, enable_cp_tp_group_sharing=False)
gdn = Qwen3_5TextConfig(**json.load(open(DIR + "/qnext-gdn/config.json")))
kda = KimiLinearConfig(**json.load(open(DIR + "/kimi-kda/config.json")))
g, k = gdn.mamba2_cache_params, kda.mamba2_cache_params
out = {
    "gdn": {"linear": gdn.linear_layer_ids, "full": gdn.full_attention_layer_ids, "layers": g.layers,
            "H": g.shape.num_k_heads_per_tp, "HV": g.shape.num_heads, "K": g.shape.state_size,
            "V": g.shape.head_dim, "temporal": list(g.shape.temporal), "conv": [list(c) for c in g.shape.conv],
            "head_dim": gdn.head_dim, "heads": [gdn.num_attention_heads, gdn.num_key_value_heads],
            "dtype": str(gdn.dtype)},
    "kda": {"linear": kda.linear_layer_ids, "full": kda.full_attention_layer_ids, "layers": k.layers,
            "H": k.shape.num_heads, "K": k.shape.head_k_dim, "V": k.shape.head_dim,
            "temporal": list(k.shape.temporal), "conv": [list(c) for c in k.shape.conv],
            "is_mla": kda.is_mla, "sparse": [_is_sparse_layer(kda, i) for i in range(kda.num_hidden_layers)],
            "mla": [kda.kv_lora_rank, kda.qk_rope_head_dim, kda.qk_nope_head_dim, kda.v_head_dim],
            "dtype": str(kda.dtype)},
}
print("RESULT" + json.dumps(out))
"""


def test_sglang_config_classes_read_the_full_size_configs(tmp_path: Path) -> None:
    """SGLang 0.5.23's own config classes (and its Kimi sparse-layer rule) on the config.json files as
    make-models writes them (same writer, no weights)."""
    for name in REAL:
        (tmp_path / name).mkdir()
        build_mod._write_json(tmp_path / name / "config.json", M.model_config(M.SPECS[name], 2048))
    proc = subprocess.run([sys.executable, "-c", _SGLANG_CONFIG_CHECK.replace("DIR", repr(str(tmp_path)))],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SGLANG_USE_CPU_ENGINE": "1"})
    assert proc.returncode == 0, proc.stderr[-4000:]
    res = json.loads(proc.stdout.split("RESULT", 1)[1])
    gdn, kda = res["gdn"], res["kda"]
    for r in (gdn, kda):
        assert r["linear"] == r["layers"] == [0, 1, 2, 4, 5, 6] and r["full"] == [3, 7]
        assert r["dtype"] == "torch.bfloat16"
    # GDN: H 16 key heads, HV 32 value heads, K = V = 128; state [HV, V, K], conv over q|k|v (2*2048 + 4096)
    assert (gdn["H"], gdn["HV"], gdn["K"], gdn["V"]) == (16, 32, 128, 128)
    assert gdn["temporal"] == [32, 128, 128] and gdn["conv"] == [[8192, 3]]
    assert gdn["head_dim"] == 256 and gdn["heads"] == [16, 2]
    # KDA: 32 heads, K = V = 128; conv over q|k|v (3 * 4096)
    assert (kda["H"], kda["K"], kda["V"]) == (32, 128, 128)
    assert kda["temporal"] == [32, 128, 128] and kda["conv"] == [[3, 12288]]
    assert kda["is_mla"] and kda["mla"] == [512, 64, 128, 128]
    assert kda["sparse"] == [False] * 8  # every MLP dense: SGLang builds no fused-MoE layer


@pytest.mark.parametrize("name", REAL)
def test_full_size_transformers_shapes_on_meta(name: str) -> None:
    """The full-size transformers model (meta device: no memory, no init) and its checkpoint names."""
    import torch

    spec = M.SPECS[name]
    cfg = M.model_config(spec, 2048)
    with torch.device("meta"):
        model = M.hf_model_class(spec.family)(M.hf_config_class(spec.family).from_dict(dict(cfg)))
    sd = _checkpoint_state_dict(spec, model)
    assert all(t.dtype == torch.bfloat16 for t in sd.values())
    shapes = {k: tuple(t.shape) for k, t in sd.items()}
    n_params = sum(t.numel() for t in sd.values())
    if name == "qnext-gdn":
        assert n_params == 516_919_424
        gdn = "model.layers.0.linear_attn."
        assert shapes[gdn + "in_proj_qkv.weight"] == (2 * 16 * 128 + 32 * 128, 2048)
        assert shapes[gdn + "in_proj_z.weight"] == (32 * 128, 2048)
        assert shapes[gdn + "in_proj_b.weight"] == shapes[gdn + "in_proj_a.weight"] == (32, 2048)
        assert shapes[gdn + "conv1d.weight"] == (8192, 1, 4) and shapes[gdn + "A_log"] == (32,)
        attn = "model.layers.3.self_attn."
        assert shapes[attn + "q_proj.weight"] == (16 * 256 * 2, 2048)  # with the output gate
        assert shapes[attn + "k_proj.weight"] == shapes[attn + "v_proj.weight"] == (2 * 256, 2048)
        assert {k for k in sd if ".linear_attn." in k} and not any(".mlp.experts" in k for k in sd)
    else:
        assert n_params == 499_085_248
        kda = "model.layers.0.self_attn."
        for p in ("q", "k", "v"):
            assert shapes[kda + f"{p}_proj.weight"] == (32 * 128, 2048)
            assert shapes[kda + f"{p}_conv1d.weight"] == (32 * 128, 1, 4)
        assert shapes[kda + "f_b_proj.weight"] == (32 * 128, 128) and shapes[kda + "b_proj.weight"] == (32, 2048)
        mla = "model.layers.3.self_attn."
        assert shapes[mla + "kv_a_proj_with_mqa.weight"] == (512 + 64, 2048)
        assert shapes[mla + "kv_b_proj.weight"] == (16 * (128 + 128), 512)
        assert shapes[mla + "q_proj.weight"] == (16 * (128 + 64), 2048)
        assert not any("block_sparse_moe" in k or "experts" in k for k in sd)
    for i in range(8):
        assert shapes[f"model.layers.{i}.mlp.down_proj.weight"] == (2048, 5120)


# --- the build path, on shrunk copies -----------------------------------------------------------


@pytest.fixture(scope="module")
def shrunk_built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("real-shape-shrunk")
    return {name: M.build_model(_shrunk(name), out, log=_quiet) for name in REAL}


@pytest.mark.parametrize("name", REAL)
def test_shrunk_build_loads_in_transformers(shrunk_built: dict[str, Path], name: str, tmp_path: Path) -> None:
    import torch
    from safetensors import safe_open

    spec, path = _shrunk(name), shrunk_built[name]
    assert M.is_complete(path, spec, verify_hashes=True)
    cfg = json.loads((path / "config.json").read_text())
    assert cfg["torch_dtype"] == cfg["dtype"] == "bfloat16"
    assert _layer_kinds(cfg) == ["linear", "linear", "linear", "full"] * 2
    with safe_open(str(path / M.WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
        assert all(f.get_tensor(k).dtype == torch.bfloat16 for k in names)
        lm_head = f.get_tensor("lm_head.weight")
    assert lm_head[: len(M.SPECIAL_TOKENS)].abs().sum() == 0
    if name == "kimi-kda":
        assert not any("block_sparse_moe" in k or "experts" in k for k in names)
        assert "model.layers.0.self_attn.q_conv1d.weight" in names and "model.layers.7.mlp.gate_proj.weight" in names

    cls = M.hf_model_class(spec.family)
    model, info = cls.from_pretrained(str(path), dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    # the checkpoint is the freshly built model, rounded to bfloat16
    fresh = M._hf_model(spec, M.model_config(spec, M.tokenizer_vocab_size()))
    with torch.no_grad():
        for p in fresh.parameters():
            p.copy_(p.to(torch.bfloat16).float())
        ids = torch.arange(4, 40).unsqueeze(0)
        logits = model(ids).logits
        assert torch.allclose(logits, fresh(ids).logits, atol=1e-5, rtol=0)
        assert float(logits[0, -1].std()) > 0.1
        out = model.generate(ids, max_new_tokens=12, min_new_tokens=12, do_sample=False,
                             pad_token_id=M.PAD_ID)[0, ids.shape[1]:].tolist()
    assert all(len(M.SPECIAL_TOKENS) <= t < M.TOKENIZER_VOCAB for t in out)

    # deterministic: a second build gives the same bytes
    again = M.build_model(spec, tmp_path, log=_quiet)
    for f in sorted(p.name for p in path.iterdir()):
        assert (again / f).read_bytes() == (path / f).read_bytes(), f


def test_fast_init_refuses_tensors_transformers_left_unset(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bfloat16 specs skip torch's per-module init; a tensor transformers' init then leaves alone
    (uninitialised memory) is an error, never a silent garbage weight."""
    spec = _shrunk("qnext-gdn")
    cls = M.hf_model_class(spec.family)
    monkeypatch.setattr(cls, "initialize_weights", lambda self: None)
    with pytest.raises(RuntimeError, match="left .* unset"):
        M._hf_model(spec, M.model_config(spec, 2048))


def test_unknown_weight_dtype_is_refused(tmp_path: Path) -> None:
    spec = dataclasses.replace(_shrunk("kimi-kda"), weight_dtype="float8")
    with pytest.raises(ValueError, match="weight_dtype"):
        M.build_model(spec, tmp_path, log=_quiet)


# --- the linear-attention memory (ModelSpec.memory_init) ------------------------------------------


def _decay_gates(name: str, memory_init: str | None) -> list[tuple[Any, Any, Any]]:
    """(A, dt_bias, gate input for a unit-variance hidden state) of every linear-attention layer of a
    shrunk copy of ``SPECS[name]`` with 16 gate heads, built by ``_hf_model`` (the build's code path)."""
    import torch

    spec = _shrunk(name)
    wide = {"linear_num_key_heads": 4, "linear_num_value_heads": 16} if spec.family == "gdn" else {"linear_num_heads": 16}
    spec = dataclasses.replace(spec, shape={**spec.shape, **wide}, memory_init=memory_init)
    model = M._hf_model(spec, M.model_config(spec, 2048))
    x = torch.randn(256, spec.shape["hidden_size"], generator=torch.Generator().manual_seed(0))
    out = []
    with torch.no_grad():
        for _, mod in sorted(model.named_modules(), key=lambda kv: kv[0]):
            if hasattr(mod, "in_proj_a") and hasattr(mod, "A_log"):
                out.append((mod.A_log.exp(), mod.dt_bias, mod.in_proj_a(x)))
            elif hasattr(mod, "f_b_proj") and hasattr(mod, "A_log"):
                k = mod.head_dim
                out.append((mod.A_log.exp().flatten().repeat_interleave(k), mod.dt_bias, mod.f_b_proj(mod.f_a_proj(x))))
    assert len(out) == 6
    return out


@pytest.mark.parametrize("name", REAL)
def test_real_shape_decay_gates_remember(name: str) -> None:
    """The real-shape models exist to check that served states are exact: a model whose linear-attention
    heads forget their state within a token or two makes those checks blind. With memory_init="mamba"
    the per-token decay exp(-A * softplus(dt_bias)) spans ~0.2..0.999 (memories of ~1 to ~1000 tokens),
    about half the gate channels keep > 0.9 per token, and the data-dependent gate input moves
    softplus(a + dt_bias) by well under e^1."""
    import torch
    import torch.nn.functional as F

    gates = _decay_gates(name, "mamba")
    decay = torch.cat([torch.exp(-A * F.softplus(dt_bias)) for A, dt_bias, _ in gates])
    # the recipe's expectation: ~59% of channels above 0.9 per token (A * dt < 0.105)
    assert float((decay > 0.9).float().mean()) >= 0.45, decay
    assert float((decay > 0.99).float().mean()) >= 0.05 and float(decay.min()) > 0.1
    for A, dt_bias, a in gates:
        dt = F.softplus(dt_bias)
        assert float(dt.min()) > 0.9e-3 and float(dt.max()) < 0.11 and 1 <= float(A.min()) and float(A.max()) <= 16
        assert 0.45 < float(a.pow(2).mean().sqrt()) < 0.55
        ratio = F.softplus(a + dt_bias) / dt
        assert float(ratio.log().abs().median()) < 0.5
    if name == "qnext-gdn":  # what transformers' own GDN init gives: nearly every head forgets at once
        for A, dt_bias, a in _decay_gates(name, None):
            assert float((torch.exp(-A * F.softplus(a + dt_bias)) > 0.9).float().mean()) < 0.2


def test_memory_init_is_seeded_and_checked(tmp_path: Path) -> None:
    import torch

    spec = _shrunk("qnext-gdn")
    one, two = (M._hf_model(spec, M.model_config(spec, 2048)) for _ in range(2))
    for (k, p), q in zip(one.state_dict().items(), two.state_dict().values(), strict=True):
        assert torch.equal(p, q), k
    with pytest.raises(ValueError, match="memory_init"):
        M.build_model(dataclasses.replace(spec, memory_init="xavier"), tmp_path, log=_quiet)
