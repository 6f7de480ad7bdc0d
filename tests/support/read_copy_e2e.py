"""End to end on the CPU runtime: the read copy (``SGLANG_REPLAYSSM_READ_COPY``) against the fp32 ring.

One real server per arm (tiny fp32 models, ``--enable-linear-replayssm``, extra_buffer so prompts hit the
radix cache), the same greedy generations with top-k logprobs in each, compared with arm ``off``:

* greedy agreement: the share of generated positions whose token equals ``off``'s; the first
  position where a prompt's tokens differ, and the mean share of tokens before it (prefix agreement:
  after a divergence the contexts differ, so later positions compare different continuations);
* per-token KL(off || arm), approximated from the top-k logprobs: at each position up to and including
  the first divergence (the contexts are identical there), both distributions restricted to the tokens
  in both top-k lists and renormalised over them; the mean over those positions, and the share of
  ``off``'s probability those shared tokens cover;
* hit rates: ``cached_tokens`` per request (must equal ``off``'s: the copy never changes what is cached).

Arms: ``off``, ``bf16``, ``fp8`` (the read copy) and, for contrast, ``bf16-state`` (SGLang's
``--mamba-ssm-dtype bfloat16`` with the ring and no read copy: a shared low-precision state).
"""

from __future__ import annotations

import math
import random
from pathlib import Path
from typing import Any

from sglang_replayssm.radix.config import READ_COPY_ENV

__all__ = ["ARMS", "compare", "prefix_agreement", "prompts", "run_arm"]

#: arm -> (extra environment, extra server flags)
ARMS: dict[str, tuple[dict[str, str], list[str]]] = {
    "off": ({}, []),
    "bf16": ({READ_COPY_ENV: "bf16"}, []),
    "fp8": ({READ_COPY_ENV: "fp8"}, []),
    "bf16-state": ({}, ["--mamba-ssm-dtype", "bfloat16"]),
    "off-repeat": ({}, []),  # the noise floor: a second off server (batch composition may differ)
}


def prompts(n: int = 8, seed: int = 0, prefix_len: int = 100) -> list[list[int]]:
    """``n`` prompts sharing a ``prefix_len``-token prefix (past one 64-token track boundary), distinct tails."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 2000) for _ in range(prefix_len)]
    return [prefix + [rng.randrange(10, 2000) for _ in range(5 + 3 * i)] for i in range(n)]


def server_flags(ring_len: int) -> list[str]:
    return ["--mamba-radix-cache-strategy", "extra_buffer", "--mamba-track-interval", "64",
            "--enable-linear-replayssm", "--linear-replayssm-cache-len", str(ring_len)]  # fmt: skip


def run_arm(model_dir: Path, arm: str, log_path: Path, *, n_prompts: int = 8, new_tokens: int = 256,
            ring_len: int = 16, top_k: int = 10) -> dict[str, Any]:  # fmt: skip
    """One server for ``arm``: the first prompt alone (it caches the shared prefix), then the others
    concurrently (batched decode, each hitting the prefix)."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.support.serve import cpu_server, generate

    env, flags = ARMS[arm]
    first, *rest = prompts(n_prompts)
    with cpu_server(model_dir, [*server_flags(ring_len), *flags], log_path, env=env) as url:
        results = [generate(url, first, new_tokens, top_logprobs=top_k)]
        with ThreadPoolExecutor(max_workers=max(len(rest), 1)) as pool:
            results += list(pool.map(lambda p: generate(url, p, new_tokens, top_logprobs=top_k), rest))
    log = log_path.read_text(errors="replace")
    return {"arm": arm, "results": results, "read_copy_in_log": "sglang-replayssm read copy" in log}


def _kl_topk(p: dict[int, float], q: dict[int, float]) -> tuple[float, float]:
    """(KL(p || q) over the tokens in both top-k lists, renormalised; p's mass on those tokens)."""
    shared = [t for t in p if t in q]
    if not shared:
        return math.inf, 0.0
    pz = sum(math.exp(p[t]) for t in shared)
    qz = sum(math.exp(q[t]) for t in shared)
    kl = sum(math.exp(p[t]) / pz * ((p[t] - math.log(pz)) - (q[t] - math.log(qz))) for t in shared)
    return max(kl, 0.0), pz / sum(math.exp(v) for v in p.values())


def prefix_agreement(first_divergence: list[int | None], lengths: list[int]) -> float:
    """Mean share of each prompt's tokens generated before its first divergence (None: none)."""
    shares = [(n if d is None else d) / max(n, 1) for d, n in zip(first_divergence, lengths)]
    return sum(shares) / max(len(shares), 1)


def compare(ref: dict[str, Any], got: dict[str, Any]) -> dict[str, Any]:
    """Agreement, approximate KL and hit rates of ``got`` against ``ref`` (module docstring)."""
    same = total = 0
    kls: list[float] = []
    cover: list[float] = []
    first_diff: list[int | None] = []
    for r, g in zip(ref["results"], got["results"]):
        a, b = r["output_ids"], g["output_ids"]
        same += sum(x == y for x, y in zip(a, b))
        total += len(a)
        diff = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        first_diff.append(diff)
        upto = len(a) if diff is None else diff + 1
        for t in range(upto):
            kl, c = _kl_topk(r["top"][t], g["top"][t])
            kls.append(kl)
            cover.append(c)
    return {
        "greedy_agreement": same / max(total, 1),
        "prefix_agreement": prefix_agreement(first_diff, [len(r["output_ids"]) for r in ref["results"]]),
        "first_divergence": first_diff,
        "kl_mean": sum(kls) / max(len(kls), 1),
        "kl_max": max(kls, default=0.0),
        "kl_positions": len(kls),
        "topk_mass_mean": sum(cover) / max(len(cover), 1),
        "cached_tokens": [x["cached_tokens"] for x in got["results"]],
        "cached_equal_off": [x["cached_tokens"] for x in got["results"]] == [x["cached_tokens"] for x in ref["results"]],
    }
