"""Hit rate of each cache policy on a RAG-like trace, at the pool counts of the capacity model.

The capacity model (``sglang-replayssm plan``, :mod:`sglang_replayssm.bench.plan`) says how many KV tokens,
state slots and record tokens one rank holds under each policy for a real model and an HBM budget. This
script builds SGLang's real ``UnifiedRadixCache`` + mamba pool (``tests/support/simulate.py``'s fixture:
SGLang's own unit-test kit, on CPU) with tiny tensor shapes but those *counts*, divided by ``--scale``
(every count, and the trace's token lengths are given in the same scaled units), replays a seeded RAG-like
trace larger than the cache (a shared system prompt, documents drawn Zipf-like, a question per request,
follow-up turns), and reports per policy the hit rate (matched prompt tokens / prompt tokens) and the
prefill tokens computed.

What it does not model: concurrency (one request at a time, each finishing at prefill: no decode, so no
decode-time tracking and no running request holding slots); timing (TTFT, rebuild cost); speculative
decoding; HiCache; the record pool's real eviction order beyond first-in-first-out; page size > 1. The
``sglang`` arm runs with the adapter off, the others with it on (records where the policy has them).

Run from the repository root: ``PYTHONPATH=$PWD python lab/plan/simulate_capacity.py --scale 16``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Trace:
    """A seeded RAG-like trace (token ids < ``vocab``; lengths in scaled tokens)."""

    requests: int = 400
    docs: int = 60
    doc_len: int = 128
    system_len: int = 32
    question_len: int = 8
    follow_up: float = 0.3  # chance a request continues an earlier conversation
    zipf: float = 1.1
    vocab: int = 64
    seed: int = 0

    def prompts(self) -> list[list[int]]:
        rng = random.Random(self.seed)

        def seq(n: int) -> list[int]:
            return [rng.randrange(self.vocab) for _ in range(n)]

        system = seq(self.system_len)
        docs = [seq(self.doc_len) for _ in range(self.docs)]
        weights = [1 / (i + 1) ** self.zipf for i in range(self.docs)]
        out: list[list[int]] = []
        for _ in range(self.requests):
            if out and rng.random() < self.follow_up:
                out.append(rng.choice(out[-20:]) + seq(self.question_len))  # a later turn of a recent one
            else:
                out.append(system + rng.choices(docs, weights)[0] + seq(self.question_len))
        return out


def sim_config(policy: dict[str, Any], scale: int, trace: Trace, max_len: int, kind: str = "gdn",
               state_interval: int = 0) -> Any:
    from tests.support.simulate import SimConfig

    records = policy["record_tokens"] // scale
    chunk = max(64 // scale, 1)
    return SimConfig(
        # SGLang's 64-token checkpoint grid (FLA chunk) and 256-token decode track interval, scaled
        kind=kind, strategy="extra_buffer", track_interval=max(256 // scale, 1), chunk=chunk,
        head_dim=8, mamba_layers=2,
        mamba_slots=max(policy["state_slots"] // scale, 4), kv_size=max(policy["kv_tokens"] // scale, max_len + 64),
        max_reqs=4, max_context_len=max_len + 64, vocab=trace.vocab,
        records=records > 0, record_tokens=max(records, 1),
        state_interval=max(state_interval // scale // chunk, 1) * chunk if records > 0 and state_interval else 0,
    )


#: Record policies to measure, each a set of fix switches (radix/config.py) on top of the plugin's defaults.
VARIANTS: dict[str, dict[str, bool]] = {
    "fixes": {},  # the defaults as they are
    "end-state-all": {"end_state_branch": False, "record_refresh": False},  # end state replaces every tracked one
    "no-end-state": {"end_state": False, "record_refresh": False},  # the tracked state is donated (SGLang's)
    "end-state-branch": {"end_state_branch": True, "record_refresh": False},  # ... but a branch point's kept
    "branch-refresh": {"end_state_branch": True, "record_refresh": True},  # + planted records move young
}


def run_policy(policy: dict[str, Any], scale: int, trace: Trace, prompts: list[list[int]],
               disabled: tuple[str, ...] = (), kind: str = "gdn", variant: str = "fixes",
               state_interval: int = 0) -> dict[str, Any]:
    """Replay ``prompts`` (each finishing at prefill) on one policy's pools; the ceiling is the KV depth
    each admission's match reached (what every hit would be if a state were kept at every depth)."""
    from sglang_replayssm.radix import config
    from tests.support.simulate import Sim

    cfg = sim_config(policy, scale, trace, max(map(len, prompts)) + 1, kind, state_interval)
    t0 = time.perf_counter()
    plugin = policy["policy"] != "sglang"
    fixes = {**({name: False for name in disabled}), **VARIANTS[variant]} if plugin else {}
    with config.override(plugin, **fixes):
        sim = Sim(cfg)
        matched = total = ceiling = 0
        for i, prompt in enumerate(prompts):
            probe = sim.match(prompt)
            ceiling += min(int(probe.full_kv_hit_length or 0), len(prompt) - 1)
            sreq = sim.admit(prompt, [i % trace.vocab])
            matched += sreq.matched
            total += len(prompt)
    name = policy["policy"] if not plugin or variant == "fixes" else f"{policy['policy']}/{variant}"
    return {"policy": name, "kv_tokens": cfg.kv_size, "state_slots": cfg.mamba_slots,
            "record_tokens": policy["record_tokens"] // scale, "hit_rate": matched / total,
            "ceiling": ceiling / total, "prefill_tokens": total - matched, "rebuilds": getattr(sim, "rebuilds", 0),
            "seconds": round(time.perf_counter() - t0, 1)}


def _with_rounded_states(sizes: Any) -> Any:
    """``plan.sizes`` that also prices an interval state where none is exact (bf16 records: kept rounded), at the
    pool's state dtype (fp32): twice what the product now keeps (bf16, as computed), so an upper bound."""
    import dataclasses

    from sglang_replayssm.bench import plan as capacity

    def priced(model: Any, tp: int = 1, **kwargs: Any) -> Any:
        s = sizes(model, tp, **kwargs)
        interval = kwargs.get("interval", capacity.DEFAULT_STATE_INTERVAL)
        if s.interval or not interval:
            return s
        return dataclasses.replace(s, interval_state=capacity.interval_state_bytes(s.params), interval=interval)

    return priced


def main(argv: list[str] | None = None) -> int:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # the KDA rebuild's Triton kernels on CPU, as the tests run them
    from sglang_replayssm.bench import plan as capacity
    from sglang_replayssm.radix import hooks

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-next-80b")
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--cache-gib", type=float, default=40.0)
    p.add_argument("--scale", type=int, default=16, help="divide every pool count and token length by this")
    p.add_argument("--requests", type=int, default=Trace.requests)
    p.add_argument("--docs", type=int, default=Trace.docs)
    p.add_argument("--doc-len", type=int, default=Trace.doc_len)
    p.add_argument("--system-len", type=int, default=Trace.system_len,
                   help="off the scaled 64-token grid (64 / scale), e.g. 13 at scale 16, puts prefix ends off it")
    p.add_argument("--policies", default="sglang,records-off,records-default,records-4096,records-16384")
    p.add_argument("--disable-fixes", default="", help="comma-separated fixes turned off in the plugin arms")
    p.add_argument("--variants", default="fixes",
                   help=f"comma-separated record policies run on every plugin arm: {', '.join(VARIANTS)}")
    p.add_argument("--record-budgets", default="4096,16384,65536", help="record capacities planned (records-N arms)")
    p.add_argument("--ring-rows", type=int, default=0, metavar="SLOTS_PER_REQUEST",
                   help="the plugin arms with SGLANG_REPLAYSSM_RING_ROWS=on, priced as radix/budget.py charges it "
                        "(SGLang's state slots per request: 5 for extra_buffer with overlap); 0: a ring per slot")
    p.add_argument("--state-interval", type=int, default=0, metavar="TOKENS",
                   help="record arms keep an interval state every TOKENS (unscaled; the product's default is 256, "
                        "which plan charges to the record budget); 0: none, as before")
    p.add_argument("--price-rounded-states", action="store_true",
                   help="charge the record arms' interval states where bf16 serving keeps them rounded (the startup "
                        "reservation does; the default rule's price does not), at fp32: twice their bf16 bytes")
    p.add_argument("--seed", type=int, default=Trace.seed, help="the trace's random seed")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    hooks.install()
    budgets = tuple(int(x) for x in args.record_budgets.split(",") if x)
    if args.price_rounded_states:
        capacity.sizes = _with_rounded_states(capacity.sizes)
    doc = capacity.plan(capacity.preset(args.model), args.tp, int(args.cache_gib * capacity.GIB),
                        record_budgets=budgets, ring_rows=args.ring_rows)
    trace = Trace(requests=args.requests, docs=args.docs, doc_len=args.doc_len, system_len=args.system_len,
                  seed=args.seed)
    prompts = trace.prompts()
    wanted = args.policies.split(",")
    disabled = tuple(x for x in args.disable_fixes.split(",") if x)
    variants = [v for v in args.variants.split(",") if v]
    rows = [run_policy(pol, args.scale, trace, prompts, disabled, doc["model"]["family"], variant, args.state_interval)
            for pol in doc["policies"] if pol["policy"] in wanted
            for variant in (variants if pol["policy"].startswith("records-") and pol["policy"] != "records-off"
                            else variants[:1])]
    working_set = len({tuple(x[: trace.system_len + trace.doc_len]) for x in prompts}) * trace.doc_len
    print(f"{args.model} TP {args.tp}, {args.cache_gib:g} GiB/rank, counts / {args.scale}; "
          f"rings: {f'per request row ({args.ring_rows} slots/request)' if args.ring_rows else 'per slot'}; fixes off: "
          f"{', '.join(disabled) or 'none'}; trace {trace}; "
          f"distinct documents x doc_len = {working_set:,} tokens")
    print(f"{'policy':<34} {'KV tok':>8} {'slots':>6} {'rec tok':>8} {'hit rate':>9} {'ceiling':>8} "
          f"{'prefill tok':>12} {'rebuilds':>8} {'s':>6}")
    for r in rows:
        print(f"{r['policy']:<34} {r['kv_tokens']:>8,} {r['state_slots']:>6} {r['record_tokens']:>8,} "
              f"{r['hit_rate']:>9.1%} {r['ceiling']:>8.1%} {r['prefill_tokens']:>12,} {r['rebuilds']:>8} "
              f"{r['seconds']:>6}")
    if args.json is not None:
        args.json.write_text(json.dumps({"plan": doc, "scale": args.scale, "trace": trace.__dict__, "rows": rows},
                                        indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
