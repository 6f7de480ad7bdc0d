"""Workload generator: shapes, determinism, and the prefix structure each shape promises."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglang_replayssm.bench.workload import (
    Conversation,
    GspSpec,
    RagSpec,
    WorkloadError,
    describe,
    first_tokens,
    generate_gsp,
    generate_rag,
    warmup_requests,
    zipf_weights,
)

VOCAB = list(range(100, 5100))


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def by_group(convs: list[Conversation]) -> dict[int, list[Conversation]]:
    groups: dict[int, list[Conversation]] = {}
    for c in convs:
        groups.setdefault(c.group, []).append(c)
    return groups


@given(groups=st.integers(1, 5), per_group=st.integers(1, 5), sys_len=st.integers(1, 64),
       q_len=st.integers(1, 16), out_len=st.integers(1, 8), seed=st.integers(0, 10**6))
@settings(max_examples=40, deadline=None)
def test_gsp_shape_and_lengths(groups: int, per_group: int, sys_len: int, q_len: int, out_len: int,
                               seed: int) -> None:
    spec = GspSpec(num_groups=groups, prompts_per_group=per_group, system_prompt_len=sys_len,
                   question_len=q_len, output_len=out_len)
    convs = generate_gsp(spec, VOCAB, seed)
    assert len(convs) == groups * per_group
    assert [c.cid for c in convs] == list(range(len(convs)))
    assert Counter(c.group for c in convs) == {g: per_group for g in range(groups)}
    for c in convs:
        assert len(c.turns) == 1
        assert len(c.turns[0].new_ids) == sys_len + q_len
        assert c.shared_len == sys_len
        assert c.turns[0].output_len == out_len
        assert set(c.turns[0].new_ids) <= set(VOCAB)


@given(seed=st.integers(0, 10**6))
@settings(max_examples=20, deadline=None)
def test_gsp_group_members_share_exactly_the_system_prompt(seed: int) -> None:
    spec = GspSpec(num_groups=3, prompts_per_group=4, system_prompt_len=32, question_len=8)
    convs = generate_gsp(spec, VOCAB, seed)
    groups = by_group(convs)
    for members in groups.values():
        for a, b in itertools.combinations(members, 2):
            assert common_prefix(a.turns[0].new_ids, b.turns[0].new_ids) == 32
    for ga, gb in itertools.combinations(groups, 2):
        assert common_prefix(groups[ga][0].turns[0].new_ids, groups[gb][0].turns[0].new_ids) == 0


def test_gsp_same_seed_same_requests_other_seed_other_requests() -> None:
    spec = GspSpec(num_groups=3, prompts_per_group=3, system_prompt_len=20, question_len=5)
    assert generate_gsp(spec, VOCAB, 7) == generate_gsp(spec, VOCAB, 7)
    assert generate_gsp(spec, VOCAB, 7) != generate_gsp(spec, VOCAB, 8)


def test_gsp_ordered_sends_groups_in_order_and_shuffle_is_a_permutation() -> None:
    spec = GspSpec(num_groups=4, prompts_per_group=3, system_prompt_len=8, question_len=4)
    ordered = generate_gsp(GspSpec(**{**spec.__dict__, "ordered": True}), VOCAB, 3)
    shuffled = generate_gsp(spec, VOCAB, 3)
    assert [c.group for c in ordered] == sorted(c.group for c in ordered)
    assert sorted(c.turns[0].new_ids for c in shuffled) == sorted(c.turns[0].new_ids for c in ordered)
    assert [c.turns for c in shuffled] != [c.turns for c in ordered]


def test_gsp_zipf_keeps_total_and_favours_group_zero() -> None:
    spec = GspSpec(num_groups=5, prompts_per_group=40, system_prompt_len=4, question_len=2,
                   group_distribution="zipf", zipf_alpha=1.5)
    convs = generate_gsp(spec, VOCAB, 0)
    counts = Counter(c.group for c in convs)
    assert len(convs) == 200
    assert counts[0] == max(counts.values())
    assert counts[0] > 200 * zipf_weights(5, 1.5)[1]


def test_zipf_weights_are_a_distribution_decreasing_by_rank() -> None:
    w = zipf_weights(6, 1.2)
    assert sum(w) == pytest.approx(1.0)
    assert all(a > b for a, b in zip(w, w[1:]))
    assert w[0] / w[1] == pytest.approx(2**1.2)


def test_gsp_range_ratio_draws_lengths_in_range() -> None:
    spec = GspSpec(num_groups=4, prompts_per_group=8, system_prompt_len=40, question_len=20, output_len=10,
                   range_ratio=0.5)
    convs = generate_gsp(spec, VOCAB, 5)
    for c in convs:
        assert 20 <= c.shared_len <= 40
        assert 10 <= len(c.turns[0].new_ids) - c.shared_len <= 20
        assert 5 <= c.turns[0].output_len <= 10
    assert len({c.turns[0].output_len for c in convs}) > 1


def test_gsp_multi_turn_appends_only_new_questions() -> None:
    spec = GspSpec(num_groups=2, prompts_per_group=2, system_prompt_len=10, question_len=3, num_turns=3)
    for c in generate_gsp(spec, VOCAB, 1):
        assert [len(t.new_ids) for t in c.turns] == [13, 3, 3]
        assert [c.rid(t) for t in range(3)] == [f"{c.cid}.0", f"{c.cid}.1", f"{c.cid}.2"]


def test_rag_two_level_prefix_tree() -> None:
    spec = RagSpec(num_docs=3, doc_len=24, system_prompt_len=16, num_conversations=9, num_turns=2,
                   question_len=4, ordered=True)
    convs = generate_rag(spec, VOCAB, 2)
    assert len(convs) == 9
    assert Counter(c.group for c in convs) == {0: 3, 1: 3, 2: 3}
    for a, b in itertools.combinations(convs, 2):
        shared = common_prefix(a.turns[0].new_ids, b.turns[0].new_ids)
        assert shared == (16 + 24 if a.group == b.group else 16)
    for c in convs:
        assert c.shared_len == 40
        assert [len(t.new_ids) for t in c.turns] == [44, 4]


def test_rag_is_deterministic() -> None:
    spec = RagSpec(num_docs=2, doc_len=8, system_prompt_len=4, num_conversations=4, question_len=2)
    assert generate_rag(spec, VOCAB, 9) == generate_rag(spec, VOCAB, 9)


def test_warmup_requests_share_no_first_token_with_the_workload() -> None:
    small_vocab = list(range(10))
    convs = generate_gsp(GspSpec(num_groups=5, prompts_per_group=1, system_prompt_len=3, question_len=1),
                         small_vocab, 0)
    avoid = first_tokens(convs)
    assert len(avoid) == 5
    warm = warmup_requests(5, small_vocab, 0, avoid)
    assert len(warm) == 5
    assert all(t.new_ids[0] not in avoid for t in warm)


@pytest.mark.parametrize("spec", [
    GspSpec(num_groups=0),
    GspSpec(question_len=0),
    GspSpec(group_distribution="zipf"),
    GspSpec(group_distribution="pareto"),
    GspSpec(num_groups=20, system_prompt_len=2),
])
def test_gsp_rejects_bad_specs(spec: GspSpec) -> None:
    with pytest.raises(WorkloadError):
        generate_gsp(spec, list(range(10)), 0)


def test_describe_counts() -> None:
    convs = generate_rag(RagSpec(num_docs=2, doc_len=5, system_prompt_len=3, num_conversations=4, num_turns=3,
                                 question_len=2, output_len=7), VOCAB, 0)
    d = describe(convs)
    assert d == {"conversations": 4, "requests": 12, "groups": 2, "new_prompt_tokens": 4 * (10 + 2 + 2),
                 "max_output_tokens": 12 * 7}
