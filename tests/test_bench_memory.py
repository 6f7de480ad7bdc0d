"""Equal memory and the memory-bound workload (bench/memory.py), without servers."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from sglang_replayssm.bench.arms import ARMS
from sglang_replayssm.bench.cli import _workload, build_parser
from sglang_replayssm.bench.memory import (
    MIB,
    RAG_MEM_MIB,
    EqualMemoryError,
    arm_budget,
    format_spent,
    model_sizes,
    resolve_defaults,
    spent_from_log,
    working_set_tokens,
)
from sglang_replayssm.bench.plan import Sizes
from sglang_replayssm.bench.workload import Conversation, Turn

ARM_NAMES = ("baseline", "baseline-aa", "upstream", "plugin")


def small_gdn() -> Sizes:
    return model_sizes("small-gdn", "float32", 256)[1]


def rag_mem_conversations() -> list[Conversation]:
    args = build_parser().parse_args(["--dataset-name", "rag-mem"])
    resolve_defaults(args)
    return _workload(args, list(range(4, 2048)), Path("unused"))


@pytest.mark.parametrize("mib", [24.0, RAG_MEM_MIB, 64.0])
def test_every_arm_gets_the_same_budget_and_flags_pin_its_split(mib: float) -> None:
    s = small_gdn()
    budget = int(mib * MIB)
    budgets = {n: arm_budget(ARMS[n], s, budget) for n in ARM_NAMES}
    for name, b in budgets.items():
        d = b.as_dict()
        parts = d["state_bytes"] + d["ring_bytes"] + d["record_bytes"] + d["kv_bytes"]
        assert parts == d["total_bytes"] <= budget
        assert budget - parts < s.kv_per_token + s.state + s.ring  # nothing worth a unit is left over
        flags = dict(zip(b.flags[::2], b.flags[1::2]))
        assert flags == {"--max-mamba-cache-size": str(d["state_slots"]), "--max-total-tokens": str(d["kv_tokens"])}
        assert (dict(b.env).get("SGLANG_REPLAYSSM_RECORD_TOKENS") is not None) == (name == "plugin")
    assert budgets["baseline"].ring_bytes == 0 < budgets["plugin"].ring_bytes
    # The A/A control is baseline in another process: the same split, flags and server command.
    assert (budgets["baseline-aa"].split, budgets["baseline-aa"].flags) == (budgets["baseline"].split, budgets["baseline"].flags)
    assert (ARMS["baseline-aa"].flags, ARMS["baseline-aa"].plugins) == (ARMS["baseline"].flags, ARMS["baseline"].plugins)
    # The ring is charged per slot: the ReplaySSM arms hold fewer state slots in the same bytes.
    assert budgets["plugin"].split.state_slots < budgets["baseline"].split.state_slots
    assert dict(budgets["plugin"].env)["SGLANG_REPLAYSSM_RECORD_TOKENS"] == str(budgets["plugin"].split.record_tokens)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_rows_arm_turns_the_slots_ring_bytes_into_slots(overlap: bool) -> None:
    """``plugin-rows`` (``SGLANG_REPLAYSSM_RING_ROWS=on``) is priced as the plugin's budget charges it: each slot
    pays ``ceil(ring / slots per request)``, so the same bytes hold more slots than the plugin arm; its ring is one
    per request row SGLang can run (``slots // slots per request + 1``) and every part still fits the budget."""
    from sglang_replayssm.bench.memory import slots_per_request

    s = small_gdn()
    budget = int(4 * RAG_MEM_MIB * MIB)  # room for the default record pool (>= 1,024 tokens)
    per_request = slots_per_request(ARMS["plugin-rows"], overlap)
    assert per_request == (5 if overlap else 4) and slots_per_request(ARMS["upstream"], overlap) == 3
    rows, plugin = (arm_budget(ARMS[n], s, budget, overlap=overlap) for n in ("plugin-rows", "plugin-slots"))
    assert arm_budget(ARMS["plugin"], s, budget, overlap=overlap) == dataclasses.replace(rows, arm="plugin")  # auto
    d = rows.as_dict()
    assert d["state_slots"] > plugin.split.state_slots
    assert d["ring_bytes"] == (d["state_slots"] // per_request + 1) * (s.ring - 4) + (d["state_slots"] + 1) * 8
    assert d["state_bytes"] >= (d["state_slots"] + 1) * s.state
    assert d["state_bytes"] + d["ring_bytes"] + d["record_bytes"] + d["kv_bytes"] == d["total_bytes"] <= budget
    assert 0 < d["record_tokens"] <= plugin.split.record_tokens  # the default rule on what the slots leave


def test_record_tokens_override_and_refusals() -> None:
    s = small_gdn()
    off = arm_budget(ARMS["plugin"], s, int(RAG_MEM_MIB * MIB), record_tokens=0)
    assert off.split.record_tokens == 0 and off.split.record_bytes == 0 and off.env == (
        ("SGLANG_REPLAYSSM_RECORD_TOKENS", "0"),)
    assert off.split.kv_tokens > arm_budget(ARMS["plugin"], s, int(RAG_MEM_MIB * MIB), record_tokens=350).split.kv_tokens
    default = arm_budget(ARMS["plugin"], s, int(RAG_MEM_MIB * MIB)).split  # < 1,024 tokens fit: the rule's off
    assert default.record_tokens == 0 and default.kv_tokens == off.split.kv_tokens and "records off" in default.reason
    with pytest.raises(EqualMemoryError, match="state slots"):
        arm_budget(ARMS["plugin"], s, 2 * MIB)
    with pytest.raises(EqualMemoryError, match="not nextn"):
        arm_budget(ARMS["nextn"], s, int(RAG_MEM_MIB * MIB))
    with pytest.raises(EqualMemoryError, match="need"):
        arm_budget(ARMS["plugin"], s, int(RAG_MEM_MIB * MIB), record_tokens=100_000)


def test_rag_mem_working_set_is_at_least_twice_every_arms_cache() -> None:
    conversations = rag_mem_conversations()
    ws = working_set_tokens(conversations)
    s = small_gdn()
    most_kv = max(arm_budget(ARMS[n], s, int(RAG_MEM_MIB * MIB)).split.kv_tokens for n in ARM_NAMES)
    assert ws >= 2 * most_kv
    assert len({c.group for c in conversations}) >= 16 and all(len(c.turns) == 3 for c in conversations)


def test_existing_workload_defaults_are_unchanged() -> None:
    args = build_parser().parse_args(["--dataset-name", "rag"])
    resolve_defaults(args)
    assert (args.rag_num_docs, args.rag_system_prompt_len, args.rag_num_conversations, args.rag_num_turns,
            args.gsp_range_ratio, args.gsp_group_distribution, args.gsp_zipf_alpha, args.equal_memory_mib) == (
        4, 256, 8, 2, 1.0, "uniform", None, None)


def test_working_set_counts_shared_prefixes_once() -> None:
    shared = (9, 8, 7)
    convs = [Conversation(0, 0, 3, (Turn((*shared, 1, 2), 4), Turn((5,), 2))),
             Conversation(1, 0, 3, (Turn((*shared, 3), 4),))]
    assert working_set_tokens(convs) == 3 + 2 + 1 + (4 + 1 + 2) + 4


def test_spent_bytes_from_a_startup_log() -> None:
    s = small_gdn()
    log = ("sglang-replayssm records: 362 tokens x 28032 B = 11.6 MiB reserved from the KV budget (set)\n"
           "Mamba Cache is allocated. max_mamba_cache_size: 14, conv_state size: 0.00GB, ssm_state size: 0.01GB\n"
           "GDN ReplaySSM ring buffers allocated (record_len=16, fold=False): d=0.012GB, k=0.006GB, g=0.000GB\n"
           "KV Cache is allocated. dtype: torch.float32, #tokens: 3989, K size: 0.01 GB, V size: 0.01 GB\n"
           "sglang-replayssm records: 362 tokens of layer inputs (first in, first out; ...), a prefill state every "
           "256 tokens (...)\n")
    spent = spent_from_log(log, s)
    assert (spent["kv_tokens"], spent["state_slots"], spent["record_tokens"]) == (3989, 14, 362)
    assert spent["kv_bytes"] == 3989 * s.kv_per_token and spent["ring_bytes"] == 15 * s.ring
    assert spent["total_bytes"] == spent["kv_bytes"] + spent["state_bytes"] + spent["ring_bytes"] + spent["record_bytes"]
    assert spent_from_log(log, s, pool_bytes=123.0)["record_bytes"] == 123
    baseline = spent_from_log(log.replace("GDN ReplaySSM ring buffers allocated", "x"), s)
    assert baseline["ring_bytes"] == 0
    # Rings keyed by request row (SGLANG_REPLAYSSM_RING_ROWS): SGLang logs no ring, the plugin logs its rows.
    rows_log = log.replace("GDN ReplaySSM ring buffers allocated", "x") + (
        "sglang-replayssm: decode rings for 5 request rows (not 15 slots): 7.00 MiB, 14.00 MiB less than a ring per slot\n")
    assert spent_from_log(rows_log, s)["ring_bytes"] == 5 * (s.ring - 4) + 15 * 8 < spent["ring_bytes"]
    table = format_spent({"plugin": {"cache_bytes": spent, "hit_rate": 0.5, "ceiling_hit_rate": 0.6,
                                     "ttft_p50_s": 0.1, "ttft_p90_s": 0.2}})
    assert "plugin" in table and "50.0%" in table and "60.0%" in table
