"""Issue 14 end to end: NEXTN speculative decoding on a real SGLang 0.5.23 server (CPU runtime,
tiny fp32 GDN model with its fitted MTP layer), with and without the spec-verify ring.

* Greedy tokens with NEXTN (ring off; ring on, plugin on) equal the tokens without speculative
  decoding, on the MTP's fitted prompts (mean accepted length close to 4 of 4: records really pend
  across verify steps) and on follow-up requests that hit the radix cache.
* D1 (no_buffer finish donation under the spec ring): a request whose prompt extends a finished
  request's prompt + output hits the node that request donated at its full depth. With the plugin's
  ``spec_finish_donation`` fix the node holds the full state; with it off, SGLang donates
  ``temporal`` lagging by the row's pending accepted records next to a current conv window, and the
  follow-up's tokens differ.
* Streaming sessions (``session_state_depth``): a turn of 13 tokens ends on a verify's bonus token
  (1 + 3 x 4), whose KV no forward computed, yet SGLang keeps the record as if it were cached; a
  turn of 14 commits the state 2 tokens past what the session keeps. With the fix the second turns
  equal plain greedy (ring off and on); with it off they differ.

Servers are shared per module: plain, NEXTN, NEXTN + ring, NEXTN + ring with D1's and the session fix
off.
``SGLANG_REPLAYSSM_SPEC_MODELS`` names a directory to build / reuse the model in (default: a
temporary one; the MTP build is not the shared cache's tiny-gdn until the branch is merged).
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.models.mtp import FIT_NEW_TOKENS, fit_prompts
from sglang_replayssm.models.specs import SPECS
from tests.support.serve import cpu_server

pytestmark = [pytest.mark.server, pytest.mark.timeout(1800)]

NEXTN = ["--speculative-algorithm", "NEXTN", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4", "--prefill-attention-backend", "intel_amx",
         "--decode-attention-backend", "intel_amx", "--speculative-draft-attention-backend", "intel_amx"]
RING = ["--enable-linear-replayssm-spec", "--linear-replayssm-cache-len", "16"]
NO_BUFFER = ["--mamba-radix-cache-strategy", "no_buffer", "--enable-streaming-session"]
#: 1 prefill token + 4 fully accepted verify steps of 4 = 17 generated... with 20 the request finishes after
#: its 5th verify, whose commit leaves 8 accepted records pending (the ring folds every 3rd full step,
#: when write_pos + 2T > L), so the finish donation meets a lagging ``temporal`` (24 would end on a fold).
NEW_TOKENS = 20


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = os.environ.get("SGLANG_REPLAYSSM_SPEC_MODELS") or str(tmp_path_factory.mktemp("spec-models"))
    return make_models(Path(out), names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]


def _post(url: str, path: str, body: dict) -> object:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=900) as resp:
        text = resp.read()
    return json.loads(text) if text.strip() else {}


def _generate(url: str, ids: list[int], n: int, **extra: object) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True},
            **extra}
    out = _post(url, "/generate", body)
    assert isinstance(out, dict), out
    meta = out["meta_info"]
    return {"ids": out["output_ids"], "cached": meta["cached_tokens"], "accept": meta.get("spec_accept_length")}


def _workload(url: str) -> dict[str, list[dict]]:
    """Fitted prompts one by one, then for each a follow-up = prompt + its output + 3 tokens."""
    prompts = fit_prompts(SPECS["tiny-gdn"], 2048)[:4]
    first = [_generate(url, p, NEW_TOKENS) for p in prompts]
    follow = [_generate(url, p + r["ids"] + [11, 12, 13], 8) for p, r in zip(prompts, first)]
    return {"first": first, "follow": follow, "session": [_session(url, n) for n in SESSION_FIRST_TURN]}


#: First-turn lengths of the two sessions: 13 = 1 + 3 full verifies (ends on a bonus token), 14 = one
#: more verify, committed 2 tokens past the turn's end.
SESSION_FIRST_TURN = (13, 14)


def _session(url: str, first_turn: int) -> list[dict]:
    """A two-turn streaming session on fitted prompts (another group than the D1 workload's)."""
    prompts = fit_prompts(SPECS["tiny-gdn"], 2048)
    opened = _post(url, "/open_session", {"capacity_of_str_len": 100000, "streaming": True})
    sid = opened.get("session_id", opened) if isinstance(opened, dict) else opened
    try:
        return [_generate(url, p, n, session_params={"id": sid})
                for p, n in ((prompts[9], first_turn), (prompts[10][:6], 8))]
    finally:
        _post(url, "/close_session", {"session_id": sid})


ARMS = {
    "plain": (NO_BUFFER, {}),
    "nextn": ([*NEXTN, *NO_BUFFER], {}),
    "ring": ([*NEXTN, *RING, *NO_BUFFER], {}),
    "ring_fixes_off": ([*NEXTN, *RING, *NO_BUFFER],
                       {"SGLANG_REPLAYSSM_DISABLE_FIXES": "spec_finish_donation,session_state_depth"}),
}


class _Runs:
    """Each arm's server is started (and its workload run) the first time a test asks for it."""

    def __init__(self, model: Path, logs: Path) -> None:
        self.model, self.logs, self.done = model, logs, {}

    def __getitem__(self, name: str) -> dict:
        if name not in self.done:
            flags, env = ARMS[name]
            with cpu_server(self.model, flags, self.logs / f"{name}.log", env=env, timeout_s=600) as url:
                self.done[name] = _workload(url)
            (self.logs / "runs.json").write_text(json.dumps(self.done))
        return self.done[name]


@pytest.fixture(scope="module")
def runs(model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[_Runs]:
    yield _Runs(model, tmp_path_factory.mktemp("spec-logs"))


def test_fitted_prompts_fit_the_continuation_length() -> None:
    assert NEW_TOKENS < FIT_NEW_TOKENS


@pytest.mark.parametrize("arm", ["nextn", "ring"])
def test_nextn_greedy_tokens_equal_plain(runs: _Runs, arm: str) -> None:
    for part in ("first", "follow"):
        assert [r["ids"] for r in runs[arm][part]] == [r["ids"] for r in runs["plain"][part]], part
    # Hits: a finished spec request donates one token deeper than a plain one (its last token's KV was
    # written by the verify), so each follow-up hits as deep or one deeper, never shallower.
    for spec, plain in zip(runs[arm]["follow"], runs["plain"]["follow"]):
        assert plain["cached"] > 0 and spec["cached"] in (plain["cached"], plain["cached"] + 1)
    accept = [r["accept"] for r in runs[arm]["first"]]
    assert sum(accept) / len(accept) >= 3.0, accept  # >= 2 accepted drafts per verify step


def test_d1_finish_donation_is_exact_only_with_the_fix(runs: _Runs) -> None:
    plain = [r["ids"] for r in runs["plain"]["follow"]]
    assert [r["ids"] for r in runs["ring"]["follow"]] == plain
    assert [r["ids"] for r in runs["ring_fixes_off"]["follow"]] != plain


@pytest.mark.parametrize("arm", ["nextn", "ring"])
def test_session_turns_equal_plain_only_with_the_fix(runs: _Runs, arm: str) -> None:
    plain = runs["plain"]["session"]
    assert [[t["ids"] for t in s] for s in runs[arm]["session"]] == [[t["ids"] for t in s] for s in plain]
    exact, past = runs[arm]["session"]
    assert exact[0]["accept"] > 4.0 and past[0]["accept"] >= 3.5  # the turn lengths land as described
    # ended on a bonus token: the next turn hits what plain decoding hits (that token is prefilled);
    # committed past the turn: the slot was released, the next turn starts from the radix tree
    assert exact[1]["cached"] == plain[0][1]["cached"] > 0
    off = runs["ring_fixes_off"]["session"]
    assert all(o[1]["ids"] != p[1]["ids"] for o, p in zip(off, plain))  # both cases, fix off
