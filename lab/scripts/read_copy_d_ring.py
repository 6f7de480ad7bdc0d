"""The read copy's d~ / v records in SGLang's dead fp32 ``replayssm_d`` (fix ``read_copy_d_ring``): bytes per slot.

    PYTHONPATH=$PWD nice -n 19 .venv/bin/python lab/scripts/read_copy_d_ring.py [--server] --out notes/read-copy-d-ring.json

Per model shard (bf16 io, fp32 state, ring length 16): SGLang's state (conv + temporal), the decode ring and
the read copy per mamba slot, records carved or allocated (the budget's own functions). With ``--server``:
one tiny-gdn CPU server per arm (served in bf16, ``SGLANG_REPLAYSSM_READ_COPY=bf16``, the mamba pool
auto-fit), carved vs allocated: the budget's log lines, SGLang's ``max_mamba_cache_size``, and the slots
each arm's budget would give at the other's price (the CPU budget follows the host's available memory at
startup, so the two servers' budgets differ), greedy tokens and cached tokens compared.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the product, tests.support, lab

MIB = 1 << 20
#: name -> (key heads H, value heads HV, head dim K = V, GDN layers) of one TP=1 shard
SHARDS = {"qwen3-next-80b-a3b": (16, 32, 128, 36), "tiny-gdn": (2, 4, 32, 2)}


def per_slot(H: int, HV: int, D: int, layers: int, ring_len: int = 16) -> dict[str, Any]:
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateDType, Mamba2StateShape

    from sglang_replayssm.radix import config
    from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot
    from sglang_replayssm.radix.read_copy.store import bytes_per_slot

    shape = Mamba2StateShape.create(tp_world_size=1, intermediate_size=HV * D, n_groups=H, num_heads=HV,
                                    head_dim=D, state_size=D, conv_kernel=4)  # fmt: skip
    params = Mamba2CacheParams(shape=shape, layers=list(range(layers)),
                               dtype=Mamba2StateDType(conv=torch.bfloat16, temporal=torch.float32))  # fmt: skip
    base = params.mamba_cache_per_req + decode_ring_bytes_per_slot(params, ring_len)
    row: dict[str, Any] = {"state_and_ring_bytes": base}
    for fmt in ("bf16", "fp8"):
        got = {}
        for carve in (False, True):
            with config.override(True, read_copy_d_ring=carve):
                got[carve] = bytes_per_slot(params, ring_len, fmt, 2)
        row[fmt] = {"read_copy_allocated": got[False], "read_copy_carved": got[True],
                    "saved_mib_per_slot": (got[False] - got[True]) / MIB,
                    "slot_allocated_mib": (base + got[False]) / MIB, "slot_carved_mib": (base + got[True]) / MIB,
                    "more_slots_per_byte": (base + got[False]) / (base + got[True]) - 1}  # fmt: skip
    return row


def server_ab() -> dict[str, Any]:
    from sglang_replayssm.models import make_models
    from tests.support.read_copy_e2e import prompts, server_flags
    from tests.support.serve import generate, user_server

    model = make_models(names=["tiny-gdn"], log=lambda *a: None)["tiny-gdn"]
    flags = ["--device", "cpu", "--dtype", "bfloat16", "--mamba-ssm-dtype", "float32", "--skip-server-warmup",
             "--mem-fraction-static", "0.05", "--max-total-tokens", "16384", "--max-running-requests", "16",
             *server_flags(16)]  # fmt: skip
    base = per_slot(*SHARDS["tiny-gdn"])["state_and_ring_bytes"]
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for arm, disable in (("carved", ""), ("allocated", "read_copy_d_ring")):
            log = Path(tmp) / f"{arm}.log"
            env = {"SGLANG_REPLAYSSM_READ_COPY": "bf16", "SGLANG_REPLAYSSM_DISABLE_FIXES": disable}
            with user_server(model, flags, log, plugins="replayssm_cpu,replayssm_radix", env=env, timeout_s=400) as url:
                res = [generate(url, p, 48) for p in prompts(3)]
            text = log.read_text(errors="replace")
            lines = [ln.split("] ", 1)[-1] for ln in text.splitlines()
                     if "sglang-replayssm read copy" in ln or "Mamba Cache is allocated" in ln]  # fmt: skip
            charged = int(re.search(r"read copy \(bf16\): (\d+) B", text).group(1))  # type: ignore[union-attr]
            slots = int(re.search(r"max_mamba_cache_size: (\d+)", text).group(1))  # type: ignore[union-attr]
            out[arm] = {"log": lines, "charged_bytes_per_slot": charged, "max_mamba_cache_size": slots,
                        "price_bytes_per_slot": base + charged, "mamba_budget_mib": (slots + 1) * (base + charged) / MIB,
                        "tokens": [r["output_ids"] for r in res], "cached_tokens": [r["cached_tokens"] for r in res]}  # fmt: skip
    for arm, other in (("carved", "allocated"), ("allocated", "carved")):
        budget = out[arm]["mamba_budget_mib"] * MIB
        out[arm]["slots_at_this_budget"] = {a: int((budget - out[a]["price_bytes_per_slot"]) // out[a]["price_bytes_per_slot"])
                                            for a in (arm, other)}  # fmt: skip
    out["tokens_equal"] = out["carved"].pop("tokens") == out["allocated"].pop("tokens")
    out["cached_equal"] = out["carved"]["cached_tokens"] == out["allocated"]["cached_tokens"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("notes/read-copy-d-ring.json"))
    ap.add_argument("--server", action="store_true", help="also the tiny-gdn CPU server A/B (two servers)")
    args = ap.parse_args(argv)
    result: dict[str, Any] = {"per_slot": {name: per_slot(*dims) for name, dims in SHARDS.items()}}
    if args.server:
        result["server_ab"] = server_ab()
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
