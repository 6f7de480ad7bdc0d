"""The attention-only ceiling: longest prefix shared with what was sent (and finished) before, capped."""

from __future__ import annotations

import pytest

from sglang_replayssm.bench.ceiling import ceiling_hit_rate, ceiling_tokens, prompts
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.workload import Conversation, Turn


def _rec(conv: Conversation, turn: int, start: float, e2e: float, out: list[int], prompt: int = 0) -> RequestRecord:
    prompt = prompt or len(conv.turns[turn].new_ids)
    return RequestRecord(conv.rid(turn), conv.cid, turn, conv.group, prompt_tokens=prompt, start_s=start,
                         e2e_s=e2e, output_ids=out)


def test_sequential_group_hits_the_shared_prefix_and_later_turns_the_history():
    shared = tuple(range(100, 110))
    a = Conversation(0, 0, 10, (Turn(shared + (1, 2), 2), Turn((7, 8), 2)))
    b = Conversation(1, 0, 10, (Turn(shared + (3, 4), 2),))
    c = Conversation(2, 1, 0, (Turn((50, 51, 52), 2),))
    recs = [_rec(a, 0, 0.0, 1.0, [5, 6]), _rec(a, 1, 1.0, 1.0, [9, 9], prompt=16),
            _rec(b, 0, 2.0, 1.0, [5, 6]), _rec(c, 0, 3.0, 1.0, [1, 1])]
    # turn 1's prompt is turn 0's prompt + output + new ids, as the client builds it
    ids = prompts([a, b, c], recs)
    assert ids["0.1"] == list(shared) + [1, 2, 5, 6, 7, 8]
    ceiling = ceiling_tokens([a, b, c], recs)
    # 0.1: turn 0's prompt and output but its last token (12 + 1): that token's KV never exists
    assert ceiling == {"0.0": 0, "0.1": 13, "1.0": 10, "2.0": 0}
    assert ceiling_hit_rate(ceiling, recs) == pytest.approx((13 + 10) / (12 + 16 + 12 + 3))


def test_an_unfinished_request_offers_its_prompt_only_and_the_cap_is_len_minus_one():
    a = Conversation(0, 0, 4, (Turn((1, 2, 3, 4), 2),))
    b = Conversation(1, 0, 4, (Turn((1, 2, 3, 4, 5, 6), 2),))  # a's prompt + a's output
    c = Conversation(2, 0, 4, (Turn((1, 2, 3, 4), 2),))  # the same prompt again
    # b is sent while a still runs: a's output is not in the cache yet
    recs = [_rec(a, 0, 0.0, 5.0, [5, 6]), _rec(b, 0, 1.0, 1.0, [0, 0]), _rec(c, 0, 9.0, 1.0, [0, 0])]
    assert ceiling_tokens([a, b, c], recs) == {"0.0": 0, "1.0": 4, "2.0": 3}
    # once a has finished, its output counts, but its last token (no KV)
    recs[1] = _rec(b, 0, 6.0, 1.0, [0, 0])
    assert ceiling_tokens([a, b, c], recs)["1.0"] == 5
    recs[0] = _rec(a, 0, 0.0, 5.0, [5, 7])
    d = Conversation(3, 0, 4, (Turn((1, 2, 3, 4, 5, 7, 9), 2),))  # a's prompt and whole output, then more
    recs.append(_rec(d, 0, 20.0, 1.0, [0, 0]))
    assert ceiling_tokens([a, b, c, d], recs)["3.0"] == 5  # a's last token (7) was never fed: no KV


def test_failed_requests_are_left_out():
    a = Conversation(0, 0, 2, (Turn((1, 2, 3), 2), Turn((4,), 2)))
    ok = _rec(a, 0, 0.0, 1.0, [9, 9])
    failed = RequestRecord("0.1", 0, 1, 0, error="boom")
    assert ceiling_tokens([a], [ok, failed]) == {"0.0": 0}
    assert ceiling_hit_rate({"0.0": 0}, [ok, failed]) == 0.0
