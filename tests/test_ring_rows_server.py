"""Real SGLang 0.5.23 servers on the CPU runtime with decode rings keyed by request row
(``SGLANG_REPLAYSSM_RING_ROWS=on``, and ``auto`` where covered): greedy tokens equal HF transformers', one at a
time and batched, also with NEXTN speculative decoding; with extra_buffer the shared-prefix stream still hits the attention-only ceiling (records rebuilt into slots whose
rings are rows); with no_buffer, MIXED batches (short prompts arriving while a long answer decodes) and
SGLang's forced retractions move slots whose rows hold records. The pool logs its rows at startup."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.models.mtp import fit_prompts
from sglang_replayssm.models.specs import SPECS
from sglang_replayssm.settings import RING_ROWS
from tests.support.hf_reference import hf_greedy
from tests.support.serve import cpu_server
from tests.test_movers_e2e import _prefills_with_running_requests, _staggered
from tests.test_server_e2e import RING_LEN, _check_against_hf, _check_radix_stream, _prompts
from tests.test_spec_e2e import NEW_TOKENS as FIT_NEW_TOKENS
from tests.test_spec_e2e import NEXTN
from tests.test_spec_e2e import _generate as _generate_spec

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return make_models(names=("tiny-gdn", "tiny-kda"), log=lambda *a: None)


_RETRACT = {"SGLANG_TEST_RETRACT": "1", "SGLANG_TEST_RETRACT_INTERVAL": "5"}


@pytest.mark.parametrize(("model_name", "strategy", "extra", "env"), [
    # auto: the admission (launcher) resolves it to rows, which the scheduler process inherits
    ("tiny-gdn", "extra_buffer", ["--mamba-track-interval", "64"], {RING_ROWS.name: "auto"}),
    # NEXTN with the decode ring: the draft shares the target's request pool, verify reads the checkpoint
    ("tiny-gdn", "extra_buffer", [*NEXTN, "--mamba-track-interval", "64"], {RING_ROWS.name: "auto"}),
    ("tiny-kda", "no_buffer", ["--disable-overlap-schedule", "--enable-mixed-chunk", "--chunked-prefill-size", "64"],
     _RETRACT),
])  # fmt: skip
def test_greedy_tokens_equal_hf_with_rings_keyed_by_request_row(models, tmp_path, model_name, strategy, extra, env):
    flags = ["--mamba-radix-cache-strategy", strategy, *extra, "--enable-linear-replayssm",
             "--linear-replayssm-cache-len", str(RING_LEN)]  # fmt: skip
    log = tmp_path / "server.log"
    model = models[model_name]
    with cpu_server(model, flags, log, env={RING_ROWS.name: "on", **env}) as url:
        _check_against_hf(url, model)
        if strategy != "no_buffer":
            _check_radix_stream(url, model, replayssm=True)
        if "NEXTN" in flags:  # prompts the MTP layer is fitted to: drafts accepted, several tokens per verify
            fitted = fit_prompts(SPECS[model_name], 2048)[:2]
            got = [_generate_spec(url, p, FIT_NEW_TOKENS) for p in fitted]
            assert [g["ids"] for g in got] == hf_greedy(model, fitted, FIT_NEW_TOKENS, ignore_eos=True)
            assert all(g["accept"] is not None and g["accept"] > 2 for g in got), got
        else:  # a long answer decoding while short prompts arrive (MIXED batches), retracted every 5 steps
            prompts = _prompts(seed=3)
            jobs = [(0.0, prompts[0], 40), (0.4, prompts[1], 24), (0.8, prompts[2], 24)]
            results = _staggered(url, jobs)
            expected = [hf_greedy(model, [p], n, ignore_eos=True)[0] for _, p, n in jobs]
            assert [r["output_ids"] for r in results] == expected
    text = log.read_text()
    assert "decode rings for" in text and "request rows (not" in text
    if _RETRACT.items() <= env.items():  # MIXED batches ran; SGLang logs each forced retraction (meta_info does not count them)
        assert _prefills_with_running_requests(log) > 0
        assert re.search(r"Testing retraction\. #retracted_reqs: [1-9]", text), "no request was retracted"
