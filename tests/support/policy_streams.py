"""Random request streams (the records policy suite's ops) run on the simulator with fixes set, every step checked
against the fp64 oracle (``tests/test_radix_property.py``'s runner): the exactness half of an eviction-order
fix's tests (an order changes which entries go, never what a kept entry holds)."""

from __future__ import annotations

import os
from typing import Any

from sglang_replayssm.radix import config
from tests.support.simulate_model import SimConfig

__all__ = ["EXAMPLES", "STEPS", "run_policy_streams"]

#: Examples per case (``SGLANG_REPLAYSSM_SLOW=1``: 50) and steps per example.
EXAMPLES = 50 if os.environ.get("SGLANG_REPLAYSSM_SLOW") == "1" else 4
STEPS = 50


def run_policy_streams(cfg: SimConfig, **fixes: bool) -> int:
    """Run :data:`EXAMPLES` random streams of :data:`STEPS` ops on ``cfg`` with every default fix and ``fixes``
    set (derandomized: the same streams every run); returns the steps run."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    from tests.test_radix_property import _run
    from tests.test_records_policy import _apply_policy, policy_ops

    steps = {"n": 0}

    @settings(max_examples=EXAMPLES, derandomize=True, deadline=None, database=None,
              phases=(Phase.explicit, Phase.generate), suppress_health_check=[HealthCheck.too_slow])
    @given(st.lists(policy_ops, min_size=STEPS, max_size=STEPS))
    def streams(stream: list[Any]) -> None:
        with config.override(True, **fixes):
            _run(cfg, stream, apply=_apply_policy)
        steps["n"] += len(stream)

    streams()
    return steps["n"]
