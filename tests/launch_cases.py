"""Shared pieces of the user-launch tests (tests/test_user_launch.py, tests/test_launch_matrix.py).

A server is started the way a user does (`testing.serve.user_server`: plain `python -m
sglang.launch_server`, no launcher environment) with only user flags. Prompts share one prefix so
later ones hit the radix cache; greedy results carry top-k logprobs so two servers can be compared
within a precision's tolerance.
"""

from __future__ import annotations

import random

from tests.support.serve import generate

#: Flags a user sizing a CPU server passes (SGLang's default takes ~70% of host memory).
SIZES = ["--max-total-tokens", "16384", "--max-mamba-cache-size", "64"]
NEW_TOKENS = 12
TOP_K = 5
#: Largest logprob difference two servers may show at a step both agree on, and the largest gap
#: between the two candidates where greedy tokens first differ (a near-tie), per serving dtype.
TOLERANCE = {"float32": 1e-3, "float16": 0.05, "auto": 0.05, "bfloat16": 0.3}


def user_flags(strategy: str, replayssm: bool, dtype: str | None = None, extra: list[str] | None = None) -> list[str]:
    flags = [*SIZES, "--mamba-radix-cache-strategy", strategy]
    if dtype is not None:
        flags += ["--dtype", dtype]
    if replayssm:
        flags += ["--enable-linear-replayssm"]
    return flags + list(extra or [])


def prompts(lengths: list[int], seed: int = 0) -> list[list[int]]:
    """One prompt per length, all sharing the longest possible common prefix (5 distinct last tokens)."""
    rng = random.Random(seed)
    prefix = [rng.randrange(10, 2000) for _ in range(max(lengths))]
    return [prefix[: n - 5] + [rng.randrange(10, 2000) for _ in range(5)] for n in lengths]


def serve(url: str, lengths: list[int]) -> list[dict]:
    """The prompts one after another (each later one can hit the earlier ones' prefix)."""
    return [generate(url, p, NEW_TOKENS, timeout_s=900, top_logprobs=TOP_K) for p in prompts(lengths)]


def differences(a: list[dict], b: list[dict], tol: float) -> list[str]:
    """Where two servers' greedy results disagree beyond ``tol``; empty when they agree.

    Per request: at every step before the first differing token the chosen token's logprobs are
    within ``tol``; at the first differing step each side's token is in the other's top-k and the
    two candidates' logprobs there are within ``tol`` of each other (a near-tie that precision
    breaks either way). After a divergence the continuations are different texts and not compared.
    """
    out = []
    for i, (x, y) in enumerate(zip(a, b)):
        for step, (tx, ty) in enumerate(zip(x["output_ids"], y["output_ids"])):
            if tx == ty:
                if abs(x["logprobs"][step] - y["logprobs"][step]) > tol:
                    out.append(f"request {i} step {step}: logprob {x['logprobs'][step]:.4f} vs "
                               f"{y['logprobs'][step]:.4f}")
                    break
                continue
            top_x, top_y = x["top"][step], y["top"][step]
            if ty not in top_x or tx not in top_y:
                out.append(f"request {i} step {step}: token {tx} vs {ty}, not in each other's top-{TOP_K}")
            elif abs(top_x[tx] - top_x[ty]) > tol or abs(top_y[ty] - top_y[tx]) > tol:
                out.append(f"request {i} step {step}: token {tx} vs {ty}, no near-tie "
                           f"({top_x[tx]:.4f}/{top_x[ty]:.4f} vs {top_y[ty]:.4f}/{top_y[tx]:.4f})")
            break
    return out
