#!/usr/bin/env python
"""Measure how much a cached prefix saves on the embedded ``small-gdn`` model (HF transformers, fp32, CPU).

Times a cold prefill of ``--total`` tokens against the prefill of only the last ``--tail`` tokens on
top of a cache holding the rest (KV cache for the full-attention layers, conv + recurrent state for
the GDN layers), i.e. what a radix-cache hit leaves to compute. The shared-prefix benchmark needs
the cold prefill to cost several times the cached one, so TTFT reflects cache hits. Also checks that
the cached run's last-token logits equal the cold run's.

    .venv/bin/python lab/scripts/measure_small_gdn_prefill.py [--model-dir DIR] [--total 2048] [--tail 64]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time
from pathlib import Path

import torch

from sglang_replayssm.models import DEFAULT_OUT, SPECS, hf_model_class, make_models


def _timed(fn: object) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()  # type: ignore[operator]
    return time.perf_counter() - t0, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=None,
                        help=f"model directory (default: build/reuse small-gdn under {DEFAULT_OUT})")
    parser.add_argument("--total", type=int, default=2048, help="prompt length (tokens)")
    parser.add_argument("--tail", type=int, default=64, help="uncached tail length (tokens)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    model_dir = args.model_dir or make_models(DEFAULT_OUT, names=["small-gdn"])["small-gdn"]
    model = hf_model_class(SPECS["small-gdn"].family).from_pretrained(str(model_dir), dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(4, vocab, (1, args.total), generator=gen)
    prefix, tail = ids[:, : args.total - args.tail], ids[:, args.total - args.tail:]

    cold: list[float] = []
    cached: list[float] = []
    with torch.inference_mode():
        model(ids, use_cache=True)  # warm-up at full length (allocator, first-call costs)
        cold_logits = None
        for _ in range(args.reps):
            dt, out = _timed(lambda: model(ids, use_cache=True))
            cold.append(dt)
            cold_logits = out.logits[0, -1]
        base = model(prefix, use_cache=True).past_key_values
        tail_logits = None
        for _ in range(args.reps):
            cache = copy.deepcopy(base)
            dt, out = _timed(lambda cache=cache: model(tail, past_key_values=cache, use_cache=True))
            cached.append(dt)
            tail_logits = out.logits[0, -1]

    # min is the least disturbed by other processes on a small shared machine; median shown too
    c, h = min(cold), min(cached)
    assert cold_logits is not None and tail_logits is not None
    diff = (cold_logits - tail_logits).abs().max().item()
    print(f"model            {model_dir}")
    print(f"threads          {args.threads}")
    print(f"cold  prefill    {args.total} tokens: min {c * 1000:8.1f} ms, median {statistics.median(cold) * 1000:8.1f} ms")
    print(f"cached prefill   {args.tail} tokens on a {args.total - args.tail}-token cache: min {h * 1000:8.1f} ms, "
          f"median {statistics.median(cached) * 1000:8.1f} ms")
    print(f"ratio cold/cached {c / h:.1f}x (min/min), {statistics.median(cold) / statistics.median(cached):.1f}x "
          "(median/median)")
    print(f"last-token logits, cold vs cached: max |diff| {diff:.2e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
