"""Real SGLang 0.5.23 servers on the CPU runtime with decode rings keyed by request row
(``SGLANG_REPLAYSSM_RING_ROWS=on``): greedy tokens equal HF transformers', one at a time and batched, and
with extra_buffer the shared-prefix stream still hits the attention-only ceiling (records rebuilt into
slots whose rings are rows). The pool logs its rows at startup."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglang_replayssm.models import make_models
from sglang_replayssm.settings import RING_ROWS
from tests.support.serve import cpu_server
from tests.test_server_e2e import RING_LEN, _check_against_hf, _check_radix_stream

pytestmark = [pytest.mark.server, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def models() -> dict[str, Path]:
    return make_models(names=("tiny-gdn", "tiny-kda"), log=lambda *a: None)


@pytest.mark.parametrize(("model_name", "strategy", "extra"), [
    ("tiny-gdn", "extra_buffer", ["--mamba-track-interval", "64"]),
    ("tiny-kda", "no_buffer", ["--disable-overlap-schedule"]),
])  # fmt: skip
def test_greedy_tokens_equal_hf_with_rings_keyed_by_request_row(models, tmp_path, model_name, strategy, extra):
    flags = ["--mamba-radix-cache-strategy", strategy, *extra, "--enable-linear-replayssm",
             "--linear-replayssm-cache-len", str(RING_LEN)]  # fmt: skip
    log = tmp_path / "server.log"
    with cpu_server(models[model_name], flags, log, env={RING_ROWS.name: "on"}) as url:
        _check_against_hf(url, models[model_name])
        if strategy != "no_buffer":
            _check_radix_stream(url, models[model_name], replayssm=True)
    assert "decode rings for" in log.read_text() and "request rows (not" in log.read_text()
