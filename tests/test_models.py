"""The embedded test models (the sglang_replayssm.models package) and the HF greedy reference (testing.hf_reference)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sglang_replayssm import models as M
from tests.support import hf_reference

REPO = Path(__file__).resolve().parents[1]
TINY = ("tiny-gdn", "tiny-kda")


def _quiet(msg: str) -> None:
    pass


@pytest.fixture(scope="session")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The tiny models, built in this process."""
    return M.make_models(tmp_path_factory.mktemp("models"), names=TINY, log=_quiet)


def _config(path: Path) -> dict[str, Any]:
    return json.loads((path / "config.json").read_text())


def _run(code: str, timeout: int = 300, env: dict[str, str] | None = None) -> str:
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


# --- building -------------------------------------------------------------------------------


def test_two_builds_are_byte_identical(built: dict[str, Path], tmp_path: Path) -> None:
    # A second build in a fresh process: the tokenizer is retrained and the weights re-drawn there.
    _run(f"from sglang_replayssm.models import make_models; make_models({str(tmp_path)!r}, names={list(TINY)!r})")
    for name in TINY:
        files = sorted(p.name for p in built[name].iterdir())
        assert files == sorted(p.name for p in (tmp_path / name).iterdir())
        assert M.WEIGHTS_FILE in files and M.MARKER in files
        for f in files:
            assert (built[name] / f).read_bytes() == (tmp_path / name / f).read_bytes(), (name, f)


def test_complete_copy_is_not_rebuilt(built: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    def fail(*args: object) -> None:
        raise AssertionError("rebuilt a complete model")

    monkeypatch.setattr("sglang_replayssm.models.build._build_into", fail)  # what build_model calls
    out = M.make_models(built["tiny-gdn"].parent, names=["tiny-gdn"], log=_quiet)
    assert out["tiny-gdn"] == built["tiny-gdn"]
    assert M.is_complete(built["tiny-gdn"], M.SPECS["tiny-gdn"], verify_hashes=True)


def test_incomplete_or_stale_copy_is_rebuilt(built: dict[str, Path], tmp_path: Path) -> None:
    spec = M.SPECS["tiny-gdn"]
    target = tmp_path / "tiny-gdn"
    target.mkdir()
    (target / "config.json").write_text("{}")  # a half-written directory without marker
    assert not M.is_complete(target, spec)
    M.build_model(spec, tmp_path, log=_quiet)
    assert M.is_complete(target, spec, verify_hashes=True)
    assert not list(tmp_path.glob(".tiny-gdn.tmp-*")) and not list(tmp_path.glob(".tiny-gdn.old-*"))
    marker = json.loads((target / M.MARKER).read_text())
    assert marker == json.loads((built["tiny-gdn"] / M.MARKER).read_text())
    # a marker from another builder version does not count
    marker["builder_version"] = M.BUILDER_VERSION + 1
    (target / M.MARKER).write_text(json.dumps(marker))
    assert not M.is_complete(target, spec)


def test_unknown_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown model"):
        M.make_models(tmp_path, names=["huge-gdn"])


# --- configs --------------------------------------------------------------------------------


def _layer_kinds(cfg: dict[str, Any]) -> list[str]:
    """'linear' / 'full' per layer, as SGLang derives it (interval for Qwen3.5, 1-based kda_layers for Kimi)."""
    n = cfg["num_hidden_layers"]
    if cfg["model_type"] == "kimi_linear":
        kda = set(cfg["linear_attn_config"]["kda_layers"])
        return ["linear" if i + 1 in kda else "full" for i in range(n)]
    return ["full" if (i + 1) % cfg["full_attention_interval"] == 0 else "linear" for i in range(n)]


@pytest.mark.parametrize("name", TINY)
def test_config_fields(built: dict[str, Path], name: str) -> None:
    cfg = _config(built[name])
    assert cfg["torch_dtype"] == cfg["dtype"] == "float32"
    assert cfg["vocab_size"] == M.tokenizer_vocab_size() == 2048
    kinds = _layer_kinds(cfg)
    assert "linear" in kinds and "full" in kinds
    if name == "tiny-gdn":
        assert cfg["architectures"] == ["Qwen3_5ForCausalLM"] and cfg["model_type"] == "qwen3_5_text"
        assert kinds == ["linear", "full", "linear", "full"]
        # transformers' layer_types agree with SGLang's interval rule
        assert ["linear" if t == "linear_attention" else "full" for t in cfg["layer_types"]] == kinds
        assert cfg["linear_key_head_dim"] >= 32 and cfg["linear_value_head_dim"] >= 32
        assert cfg["hidden_size"] == 64
    else:
        assert cfg["architectures"] == ["KimiLinearForCausalLM"] and cfg["model_type"] == "kimi_linear"
        assert kinds == ["linear", "full", "linear", "full"]
        lin = cfg["linear_attn_config"]
        assert lin["head_dim"] >= 32
        assert sorted(lin["kda_layers"] + lin["full_attn_layers"]) == [1, 2, 3, 4]
        assert cfg["num_experts"] == 4 and cfg["num_shared_experts"] == 1 and cfg["first_k_dense_replace"] == 1
        assert cfg["kv_lora_rank"] + cfg["qk_rope_head_dim"] == 288


def test_transformers_reads_configs_like_sglang(built: dict[str, Path]) -> None:
    for name in TINY:
        cfg = _config(built[name])
        hf = M.hf_config_class(M.SPECS[name].family).from_pretrained(str(built[name]))
        assert ["linear" if t == "linear_attention" else "full" for t in hf.layer_types] == _layer_kinds(cfg)
        assert hf.vocab_size == cfg["vocab_size"]
    kimi = M.hf_config_class("kda").from_pretrained(str(built["tiny-kda"]))
    assert kimi.linear_head_dim == 32 and kimi.linear_num_heads == 2
    assert kimi.num_local_experts == 4 and kimi.num_experts_per_tok == 2
    assert kimi.mlp_layer_types == ["dense", "sparse", "sparse", "sparse"]


def test_small_gdn_shape_without_building() -> None:
    import torch

    spec = M.SPECS["small-gdn"]
    cfg = M.model_config(spec, 2048)
    kinds = _layer_kinds(cfg)
    assert kinds.count("linear") == 6 and kinds.count("full") == 2
    assert cfg["linear_key_head_dim"] >= 32 and cfg["dtype"] == "float32"
    hf_cfg = M.hf_config_class("gdn").from_dict(dict(cfg))
    with torch.device("meta"):
        model = M.hf_model_class("gdn")(hf_cfg)
    n_bytes = 4 * sum(p.numel() for p in model.parameters())
    assert 50e6 < n_bytes < 300e6


def test_checkpoint_names(built: dict[str, Path]) -> None:
    from safetensors import safe_open

    with safe_open(str(built["tiny-kda"] / M.WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
        assert f.metadata() == {"format": "pt"}
        assert all(f.get_tensor(k).dtype.is_floating_point for k in names)
    # dense layer 0 is mlp.* (SGLang's loader), MoE layers keep the checkpoint names
    assert "model.layers.0.mlp.gate_proj.weight" in names
    assert not any(n.startswith("model.layers.0.block_sparse_moe") for n in names)
    assert "model.layers.1.block_sparse_moe.experts.3.w2.weight" in names
    assert "model.layers.1.block_sparse_moe.gate.e_score_correction_bias" in names
    assert "model.layers.0.self_attn.q_conv1d.weight" in names and "model.layers.0.self_attn.f_a_proj.weight" in names
    with safe_open(str(built["tiny-gdn"] / M.WEIGHTS_FILE), "pt") as f:
        names = set(f.keys())
        lm_head = f.get_tensor("lm_head.weight")
    assert "model.layers.0.linear_attn.in_proj_qkv.weight" in names
    assert "model.layers.1.self_attn.q_proj.weight" in names
    # the MTP draft layer (models/mtp.py), as Qwen3.5 checkpoints ship it
    assert {"mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight",
            "mtp.layers.0.self_attn.q_proj.weight", "mtp.layers.0.mlp.down_proj.weight"} <= names
    assert _config(built["tiny-gdn"])["mtp_num_hidden_layers"] == 1
    assert lm_head[: len(M.SPECIAL_TOKENS)].abs().sum() == 0 and lm_head[len(M.SPECIAL_TOKENS):].abs().min() >= 0


@pytest.mark.parametrize("name", TINY)
def test_transformers_loads_every_weight(built: dict[str, Path], name: str) -> None:
    import torch

    cls = M.hf_model_class(M.SPECS[name].family)
    model, info = cls.from_pretrained(str(built[name]), dtype=torch.float32, output_loading_info=True)
    assert not any(info.values()), info
    assert model.dtype == torch.float32
    fresh = M._hf_model(M.SPECS[name], _config(built[name]))
    ids = torch.arange(4, 40).unsqueeze(0)
    with torch.no_grad():
        assert torch.allclose(model(ids).logits, fresh(ids).logits, atol=1e-5, rtol=0)


_SGLANG_CONFIG_CHECK = r"""
import json, sys
from sglang.srt.configs.kimi_linear import KimiLinearConfig
from sglang.srt.configs.qwen3_5 import Qwen3_5TextConfig
out = {}
for name, path in json.loads(sys.argv[1]).items():
    raw = json.load(open(path + "/config.json"))
    cls = {"qwen3_5_text": Qwen3_5TextConfig, "kimi_linear": KimiLinearConfig}[raw["model_type"]]
    cfg = cls(**raw)
    out[name] = {"linear": cfg.linear_layer_ids, "full": cfg.full_attention_layer_ids, "vocab": cfg.vocab_size}
    if raw["model_type"] == "kimi_linear":
        out[name].update(is_mla=cfg.is_mla, is_moe=cfg.is_moe, head_dim=cfg.linear_attn_config["head_dim"])
    else:
        out[name].update(rope=cfg.rope_parameters["rope_theta"], partial=cfg.partial_rotary_factor,
                         k=cfg.linear_key_head_dim, v=cfg.linear_value_head_dim)
print("RESULT" + json.dumps(out))
"""


def test_sglang_config_classes_read_the_configs(built: dict[str, Path]) -> None:
    arg = json.dumps({name: str(path) for name, path in built.items()})
    out = _run(_SGLANG_CONFIG_CHECK.replace("sys.argv[1]", repr(arg)))
    res = json.loads(out.split("RESULT", 1)[1])
    for name in TINY:
        assert res[name]["linear"] == [0, 2] and res[name]["full"] == [1, 3]
        assert res[name]["vocab"] == 2048
    assert res["tiny-kda"]["is_mla"] and res["tiny-kda"]["is_moe"] and res["tiny-kda"]["head_dim"] == 32
    assert res["tiny-gdn"]["rope"] == 10000.0 and res["tiny-gdn"]["partial"] == 0.25
    assert res["tiny-gdn"]["k"] == res["tiny-gdn"]["v"] == 32


_SGLANG_LOAD_CHECK = r"""
import json, os
from safetensors.torch import load_file
from sglang.srt.configs.device_config import DeviceConfig
from sglang.srt.configs.load_config import LoadConfig
from sglang.srt.configs.model_config import ModelConfig
from sglang.srt.configs.update_config import adjust_config_with_unaligned_cpu_tp
from sglang.srt.distributed import parallel_state as ps
from sglang.srt.model_loader import get_model
from sglang.srt.runtime_context import SpawnRanks, publish
from sglang.srt.server_args import ServerArgs
path = PATH
sa = ServerArgs(model_path=path, device="cpu", dtype="float32", attention_backend="torch_native",
                disable_cuda_graph=True, mamba_radix_cache_strategy="no_buffer", disable_overlap_schedule=True)
publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=None))
ps.init_distributed_environment(backend="gloo", world_size=1, rank=0, local_rank=0,
                                distributed_init_method="tcp://127.0.0.1:" + str(PORT))
ps.initialize_model_parallel()
mc = ModelConfig.from_server_args(sa)
mc.hf_config.mamba2_cache_params
lc = LoadConfig()
mc = adjust_config_with_unaligned_cpu_tp(mc, lc, 1)
model = get_model(model_config=mc, load_config=lc, device_config=DeviceConfig("cpu"))
sd = load_file(path + "/model.safetensors")
got = [sum(float(p.detach().double().abs().sum()) for p in model.parameters()), sum(p.numel() for p in model.parameters())]
sd = {k: t for k, t in sd.items() if not k.startswith("mtp.")}  # the MTP draft layer: not the main model's
want = [sum(float(t.double().abs().sum()) for t in sd.values()), sum(t.numel() for t in sd.values())]
print("RESULT" + json.dumps([got, want]))
"""


@pytest.mark.skipif(not os.environ.get("SGLANG_REPLAYSSM_SLOW"), reason="slow (~30 s a model); set SGLANG_REPLAYSSM_SLOW=1")
@pytest.mark.parametrize("name", TINY)
def test_sglang_loads_every_weight(built: dict[str, Path], name: str) -> None:
    """SGLang's own loader fills every parameter of its model class from our checkpoint (CPU, TP 1)."""
    port = 29600 + TINY.index(name)
    code = _SGLANG_LOAD_CHECK.replace("PATH", repr(str(built[name]))).replace("PORT", str(port))
    out = _run(code, timeout=600, env={"SGLANG_USE_CPU_ENGINE": "1"})
    (got_abs, got_n), (want_abs, want_n) = json.loads(out.split("RESULT", 1)[1])
    assert got_n == want_n
    assert got_abs == pytest.approx(want_abs, rel=1e-9)


# --- tokenizer ------------------------------------------------------------------------------


def test_tokenizer_round_trip_and_chat_template(built: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(built["tiny-gdn"]))
    assert len(tok) == 2048
    assert tok.convert_tokens_to_ids(list(M.SPECIAL_TOKENS)) == [0, 1, 2, 3]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"
    text = M.synthetic_text(40) + "\nUnicode: café, naïve, 東京 ✓ 12345!"
    ids = tok(text)["input_ids"]
    assert tok.decode(ids) == text
    assert len(text) / len(ids) > 3.0  # the BPE actually learned the corpus's words
    assert all(0 <= i < 2048 for i in ids)
    rendered = tok.apply_chat_template(
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Where is the river?"}],
        tokenize=False, add_generation_prompt=True)
    assert rendered == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhere is the river?<|im_end|>\n"
                        "<|im_start|>assistant\n")
    chat_ids = tok(rendered)["input_ids"]
    assert chat_ids[0] == M.IM_START_ID and chat_ids.count(M.IM_END_ID) == 2
    tok_config = json.loads((built["tiny-gdn"] / "tokenizer_config.json").read_text())
    assert tok_config["chat_template"] == M.CHAT_TEMPLATE
    # both models share the tokenizer
    assert (built["tiny-gdn"] / "tokenizer.json").read_bytes() == (built["tiny-kda"] / "tokenizer.json").read_bytes()


def test_synthetic_text_is_deterministic() -> None:
    assert M.synthetic_text(30) == M.synthetic_text(30)
    assert M.synthetic_text(30, seed=1) != M.synthetic_text(30, seed=2)
    assert len(set(M.synthetic_words())) == len(M.synthetic_words())


# --- HF greedy reference --------------------------------------------------------------------


@pytest.fixture()
def ref_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(hf_reference.CACHE_ENV, str(tmp_path / "hf-ref"))
    return tmp_path / "hf-ref"


@pytest.mark.parametrize("name", TINY)
def test_hf_greedy_runs_is_deterministic_and_cached(built: dict[str, Path], name: str, ref_cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    prompts: list[Any] = ["The river and the stone were quiet.", list(range(10, 50))]
    first = hf_reference.hf_greedy(built[name], prompts, 16, use_cache=False)
    assert [len(o) for o in first] == [16, 16]
    assert all(len(M.SPECIAL_TOKENS) <= t < 2048 for o in first for t in o)
    assert len(set(first[0])) > 4 and first[0] != first[1]  # not a constant, context-free output
    # run-to-run identical, and equal to transformers' own generate()
    assert hf_reference.hf_greedy(built[name], prompts, 16, use_cache=False) == first
    model, _, _ = hf_reference._load(str(built[name].resolve()), hf_reference.model_fingerprint(built[name]))
    ids = hf_reference.encode_prompts(built[name], prompts[:1])[0]
    generated = model.generate(torch.tensor([ids]), max_new_tokens=16, do_sample=False, min_new_tokens=16)
    assert generated[0, len(ids):].tolist() == first[0]

    # the disk cache: written on the first call, then served without touching the model
    assert hf_reference.hf_greedy(built[name], prompts, 16) == first
    assert len(list(ref_cache.glob("*.json"))) == 2

    def no_model(*args: object) -> None:
        raise AssertionError("loaded the model despite a cached result")

    monkeypatch.setattr(hf_reference, "_load", no_model)
    assert hf_reference.hf_greedy(built[name], prompts, 16) == first
    # token ids and text prompts share cache entries
    assert hf_reference.hf_greedy(built[name], [ids], 16) == first[:1]
    with pytest.raises(AssertionError, match="loaded the model"):
        hf_reference.hf_greedy(built[name], prompts, 17)  # another length is another entry


def test_hf_greedy_fingerprint_follows_the_marker(built: dict[str, Path], tmp_path: Path) -> None:
    marker = json.loads((built["tiny-gdn"] / M.MARKER).read_text())
    assert hf_reference.model_fingerprint(built["tiny-gdn"]) == "marker:" + marker["content_hash"]
    assert hf_reference.model_fingerprint(built["tiny-gdn"]) != hf_reference.model_fingerprint(built["tiny-kda"])
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "config.json").write_text("{}")
    before = hf_reference.model_fingerprint(plain)
    (plain / "model.safetensors").write_bytes(b"x")
    assert before.startswith("stat:") and hf_reference.model_fingerprint(plain) != before
