"""`sglang-replayssm plan`: the capacity model's bytes against hand-computed values and the running code."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from sglang_replayssm.bench import plan
from sglang_replayssm.radix import config, hooks
from sglang_replayssm.radix.records import budget as record_budget

GIB = 1 << 30


def test_qwen3_next_matches_the_benchmarks_table():
    """docs/BENCHMARKS.md, "Memory per cached token": Qwen3-Next-80B at TP 1, bf16 inputs, fp32 state."""
    s = plan.sizes(plan.preset("qwen3-next-80b"), 1)
    assert s.record_per_token == 594_432  # (8,192 + 2 x 32) x 2 B x 36 GDN layers
    assert s.state == 77_266_944  # (32 x 128 x 128 x 4 B + 8,192 x 3 x 2 B) x 36: 77.3 MB
    assert s.kv_per_token == 24_576  # 12 layers x 2 x 2 KV heads x 256 x 2 B
    assert s.interval == 0 and s.interval_state == 0  # bf16 h is not exact: none kept
    assert round(s.state / s.record_per_token) == 130
    fp32 = plan.sizes(plan.preset("qwen3-next-80b"), 1, record_dtype="float32")
    assert fp32.interval_state // fp32.interval == 294_912  # "294,912 B if it were fp32"
    # 16,384 tokens of records = 9.1 GiB on a whole Qwen3-Next, 1.1 GiB per rank at TP 8.
    whole = plan.split(s, 40 * GIB, "records", record_tokens=16_384)
    assert round(whole.record_bytes / GIB, 1) == 9.1
    tp8 = plan.split(plan.sizes(plan.preset("qwen3-next-80b"), 8), 40 * GIB, "records", record_tokens=16_384)
    assert round(tp8.record_bytes / GIB, 1) == 1.1
    # The default (records/budget.default_record_policy): the small pool at TP 1 (a token of records costs 24
    # tokens of KV), 65,536 tokens = 4.5 GiB per rank at TP 8 (6 tokens of KV)
    default1 = plan.split(s, 40 * GIB, "records")
    assert default1.record_tokens == 16_384 and "small pool" in default1.reason
    default8 = plan.split(plan.sizes(plan.preset("qwen3-next-80b"), 8), 40 * GIB, "records")
    assert default8.record_tokens == 65_536 and round(default8.record_bytes / GIB, 1) == 4.5


def test_kimi_linear_by_hand():
    """20 KDA layers (H = HV = 32, K = V = 128, conv 4), 7 MLA layers (512 + 64 latent), bf16."""
    s = plan.sizes(plan.preset("kimi-linear-48b"), 1)
    assert s.record_per_token == (3 * 4096 + 32 * 128 + 32) * 2 * 20  # q, k, v rows + per-channel gate + beta
    assert s.state == (32 * 128 * 128 * 4 + 3 * 3 * 4096 * 2) * 20
    assert s.kv_per_token == (512 + 64) * 7 * 2
    # MLA's latent is not split by TP; the linear layers are
    s8 = plan.sizes(plan.preset("kimi-linear-48b"), 8)
    assert s8.kv_per_token == s.kv_per_token and s8.state * 8 == s.state


def test_small_gdn_matches_the_table_and_the_running_code():
    """small-gdn (fp32): the table's numbers, and radix/records/budget.py on SGLang's cache params built
    from the spec the way the simulator builds them."""
    import torch
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    from sglang_replayssm.models.specs import SPECS

    s = plan.sizes(plan.preset("small-gdn"), 1)
    assert (s.record_per_token, s.state, s.interval_state // s.interval, s.kv_per_token) == (
        24_960, 860_160, 3_072, 2_048)
    shape = SPECS["small-gdn"].shape
    params = Mamba2CacheParams(
        shape=Mamba2StateShape.create(
            tp_world_size=1, intermediate_size=shape["linear_num_value_heads"] * shape["linear_value_head_dim"],
            n_groups=shape["linear_num_key_heads"], num_heads=shape["linear_num_value_heads"],
            head_dim=shape["linear_value_head_dim"], state_size=shape["linear_key_head_dim"], conv_kernel=4),
        layers=list(range(6)), dtype=Mamba2StateDType(conv=torch.float32, temporal=torch.float32))
    assert s.record_per_token == record_budget.record_bytes_per_token(params, 4)
    assert s.interval_state == record_budget.interval_state_bytes(params)
    assert s.state == params.mamba_cache_per_req


def _sizing(params):
    from tests.test_radix_budget import _sizing as sizing

    return sizing(params, kda=False)


@pytest.mark.parametrize("budget_mib", [40, 400])
def test_splits_agree_with_sglang_sizing_and_the_record_reservation(budget_mib, monkeypatch):
    """SGLang's real ``_handle_max_mamba_cache`` (with the plugin's ring charge and record reservation
    installed) gives the plan's slots, record capacity and the bytes left for the KV cache."""
    from tests.test_radix_budget import _publish

    hooks.install()
    monkeypatch.delenv("SGLANG_REPLAYSSM_RECORD_TOKENS", raising=False)
    monkeypatch.delenv("SGLANG_REPLAYSSM_STATE_INTERVAL", raising=False)
    model = plan.preset("small-gdn")
    s = plan.sizes(model, 1)
    budget = budget_mib << 20
    for policy, on in (("sglang", False), ("records-off", True), ("records", True)):
        schedule = _publish(enable_linear_replayssm=on, linear_replayssm_cache_len=plan.DEFAULT_RING_LEN)
        sizing = _sizing(s.params)
        with config.override(on, record_hits=policy == "records"):
            left = sizing._handle_max_mamba_cache(budget / GIB)
        got = plan.split(s, budget, policy)
        assert got.state_slots == schedule.max_mamba_cache_size, policy
        if policy == "records":
            assert got.record_tokens == record_budget.reserved_capacity(sizing)
            assert (got.record_tokens > 0) == (budget_mib >= 400)  # 40 MiB: < 1,024 record tokens fit, off
        assert abs(got.kv_tokens - left * GIB / s.kv_per_token) < 1, policy


@pytest.mark.parametrize("budget_mib", [40, 400])
def test_ring_rows_split_agrees_with_sglang_sizing(budget_mib, monkeypatch):
    """With rings keyed by request row the plan prices the ring as ``radix/budget.py`` charges it (SGLang's real
    sizing, ``SGLANG_REPLAYSSM_RING_ROWS=on``): same slots, same bytes left for the KV cache, and more slots
    than a ring per slot."""
    from tests.test_radix_budget import _publish

    hooks.install()
    monkeypatch.setenv("SGLANG_REPLAYSSM_RING_ROWS", "on")
    s = plan.sizes(plan.preset("small-gdn"), 1)
    budget = budget_mib << 20
    schedule = _publish(enable_linear_replayssm=True, linear_replayssm_cache_len=plan.DEFAULT_RING_LEN)
    sizing = _sizing(s.params)
    with config.override(True, record_hits=False):
        left = sizing._handle_max_mamba_cache(budget / GIB)
        per_request = sizing._calculate_mamba_ratio()
    got = plan.split(s, budget, "records-off", ring_rows=per_request)
    assert got.state_slots == schedule.max_mamba_cache_size > plan.split(s, budget, "records-off").state_slots
    assert abs(got.kv_tokens - left * GIB / s.kv_per_token) < 1
    assert got.total_bytes <= budget


@pytest.mark.parametrize("name", ["qwen3-next-80b", "kimi-linear-48b", "small-gdn", "qnext-gdn", "kimi-kda"])
@pytest.mark.parametrize("tp", [1, 8])
@pytest.mark.parametrize("cache_gib", [0.5, 4, 40])
def test_no_policy_exceeds_the_budget(name, tp, cache_gib):
    model = plan.preset(name)
    if model.family == "gdn" and model.num_k_heads % tp:
        pytest.skip("heads not divisible by TP")
    budget = int(cache_gib * GIB)
    doc = plan.plan(model, tp, budget)
    for p in doc["policies"]:
        assert p["total_bytes"] <= budget, p
        assert p["state_bytes"] == (p["state_slots"] + 1) * (
            doc["sizes"]["state"] + (0 if p["policy"] == "sglang" else doc["sizes"]["ring"])) or p["state_slots"] == 0
        assert p["kv_bytes"] == p["kv_tokens"] * doc["sizes"]["kv_per_token"]
    by = {p["policy"]: p for p in doc["policies"]}
    # records come out of the KV cache, never out of the state pool
    assert by["records-default"]["state_slots"] == by["records-off"]["state_slots"]
    assert by["records-default"]["kv_tokens"] <= by["records-off"]["kv_tokens"]


def test_an_explicit_budget_that_cannot_fit_is_refused():
    s = plan.sizes(plan.preset("qwen3-next-80b"), 1)
    got = plan.split(s, 4 * GIB, "records", record_tokens=65_536)
    assert got.refused and got.record_tokens == 0 and got.record_bytes == 0


def test_cli_prints_a_table_and_writes_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    from sglang_replayssm import cli

    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "qwen3-next-80b", "--tp", "8", "--cache-gib", "40", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "a state = " in text and "tokens of KV" in text
    for policy in ("sglang", "records-off", "records-default", "records-4096", "records-16384", "records-65536"):
        assert f"\n{policy} " in text
    doc = json.loads(out.read_text())
    assert doc["tp"] == 8 and doc["budget_bytes"] == 40 * GIB and len(doc["policies"]) == 6
    assert doc["sizes"]["kv_per_token"] == 12_288  # 2 KV heads over 8 ranks: one per rank


def test_cli_gpu_budget_and_errors(capsys: pytest.CaptureFixture[str]):
    args = SimpleNamespace(gpu_gib=141.0, mem_fraction_static=0.9, weights_gib=160.0, tp=8, cache_gib=None)
    assert plan.cache_budget(args) == int((141 * 0.9 - 20) * GIB)
    assert plan.main(["--model", "nope"]) == 2
    assert "unknown model 'nope'" in capsys.readouterr().err
    assert plan.main(["--gpu-gib", "80", "--weights-gib", "160"]) == 2
