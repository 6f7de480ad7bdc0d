"""`sglang-replayssm plan`: what each cache policy holds in a given number of HBM bytes, at real model sizes.

For one model (a named preset: published config facts, or one of the embedded models' specs), a TP size and
the bytes one rank gives to its caches, each policy's split of those bytes into

- **state slots** (SGLang's mamba pool: ``mamba_full_memory_ratio / (1 + ratio)`` of the budget, slots
  priced at ``mamba_cache_per_req``, plus the ReplaySSM decode ring with the plugin),
- **tokens of records** (the plugin's record pool, reserved out of what is left for the KV cache), and
- **tokens of KV** (the rest, at the attention layers' bytes per token),

with the bytes of each. Every byte count comes from the code that allocates it: SGLang's own cache params
(``Mamba2CacheParams`` / ``KimiLinearCacheParams``, built from the preset), ``radix/budget.py`` (the ring) and
``radix/records/budget.py`` (records and interval states). Only the KV bytes per token (SGLang's MHA / MLA
cell size, a product of config fields) and the split rules are restated here, each beside its source.

Invariant: every policy's ``state + record + kv`` bytes are at most the budget.

Not modelled: speculative decoding (its intermediate states), the read copy's per-slot charge, HiCache's host
pools, int8 checkpoints, page rounding, and what the running requests hold (the slots and KV of live
requests are counted as cache).
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from sglang_replayssm.radix.budget import decode_ring_bytes_per_slot
from sglang_replayssm.radix.records.budget import (
    MIN_DEFAULT_CAPACITY,
    default_record_policy,
    interval_state_bytes,
    record_bytes,
    record_bytes_per_token,
)
from sglang_replayssm.radix.records.pool import DEFAULT_CAPACITY

GIB = 1 << 30
#: SGLang 0.5.23's ``--mamba-full-memory-ratio`` fallback (arg_groups/fields/schedule.py): the mamba pool
#: gets ``ratio / (1 + ratio)`` of the memory left after the weights.
MAMBA_FULL_MEMORY_RATIO = 0.9
#: SGLang's ``--linear-replayssm-cache-len`` default: the decode ring's length.
DEFAULT_RING_LEN = 16
#: The record pool's default capacity (``radix/records/pool.py``'s DEFAULT_CAPACITY) and its floor (one
#: chunk: below it the default turns records off), as ``radix/records/budget.py`` applies them.
DEFAULT_RECORD_TOKENS = DEFAULT_CAPACITY
MIN_RECORD_TOKENS = MIN_DEFAULT_CAPACITY
#: The plugin's default spacing of interval states (``SGLANG_REPLAYSSM_STATE_INTERVAL``).
DEFAULT_STATE_INTERVAL = 256
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp8": 1}


@dataclass(frozen=True)
class ModelPreset:
    """The cache-relevant config facts of one hybrid model.

    GDN: ``num_k_heads`` (H) key heads and ``num_v_heads`` (HV) value heads of ``head_k_dim`` /
    ``head_v_dim``; KDA: H = HV, K = V. Attention KV: MHA (``kv_heads`` x ``head_dim`` for K and for V)
    or MLA (``kv_lora_rank + qk_rope_head_dim`` latent values, not split by TP).
    """

    name: str
    family: str  # "gdn" or "kda"
    linear_layers: int
    attention_layers: int
    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int
    kv_heads: int = 0
    head_dim: int = 0
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    dtype: str = "bfloat16"  # the serving (activation) dtype: records and the conv window
    source: str = ""


PRESETS: dict[str, ModelPreset] = {
    # https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json (revision 9c7f2fb):
    # num_hidden_layers 48, full_attention_interval 4 (36 GDN + 12 attention), linear_num_key_heads 16,
    # linear_num_value_heads 32, linear_key_head_dim 128, linear_value_head_dim 128, linear_conv_kernel_dim 4,
    # num_key_value_heads 2, head_dim 256, bfloat16
    "qwen3-next-80b": ModelPreset(
        "qwen3-next-80b", "gdn", linear_layers=36, attention_layers=12, num_k_heads=16, num_v_heads=32,
        head_k_dim=128, head_v_dim=128, conv_kernel=4, kv_heads=2, head_dim=256,
        source="https://huggingface.co/Qwen/Qwen3-Next-80B-A3B-Instruct/blob/main/config.json"),
    # https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json (revision e1df551):
    # num_hidden_layers 27; linear_attn_config: kda_layers 20 (1-3, 5-7, ..., 25-26), full_attn_layers
    # [4, 8, 12, 16, 20, 24, 27] (7 MLA), num_heads 32, head_dim 128, short_conv_kernel_size 4;
    # MLA kv_lora_rank 512, qk_rope_head_dim 64; bfloat16
    "kimi-linear-48b": ModelPreset(
        "kimi-linear-48b", "kda", linear_layers=20, attention_layers=7, num_k_heads=32, num_v_heads=32,
        head_k_dim=128, head_v_dim=128, conv_kernel=4, kv_lora_rank=512, qk_rope_head_dim=64,
        source="https://huggingface.co/moonshotai/Kimi-Linear-48B-A3B-Instruct/blob/main/config.json"),
}


def spec_preset(name: str) -> ModelPreset:
    """A preset from an embedded model's spec (``models/specs.py``), in its weight dtype."""
    from sglang_replayssm.models.specs import SPECS

    spec = SPECS[name]
    s = spec.shape
    if spec.family == "kda":
        return ModelPreset(
            name, "kda", linear_layers=len(s["kda_layers"]), attention_layers=len(s["full_attn_layers"]),
            num_k_heads=s["linear_num_heads"], num_v_heads=s["linear_num_heads"], head_k_dim=s["linear_head_dim"],
            head_v_dim=s["linear_head_dim"], conv_kernel=s["linear_conv_kernel_dim"],
            kv_lora_rank=s["kv_lora_rank"], qk_rope_head_dim=s["qk_rope_head_dim"], dtype=spec.weight_dtype,
            source="sglang_replayssm/models/specs.py")
    attention = s["num_hidden_layers"] // s["full_attention_interval"]
    return ModelPreset(
        name, "gdn", linear_layers=s["num_hidden_layers"] - attention, attention_layers=attention,
        num_k_heads=s["linear_num_key_heads"], num_v_heads=s["linear_num_value_heads"],
        head_k_dim=s["linear_key_head_dim"], head_v_dim=s["linear_value_head_dim"],
        conv_kernel=s["linear_conv_kernel_dim"], kv_heads=s["num_key_value_heads"], head_dim=s["head_dim"],
        dtype=spec.weight_dtype, source="sglang_replayssm/models/specs.py")


def preset(name: str) -> ModelPreset:
    """A named preset (:data:`PRESETS`) or an embedded model's (``small-gdn``, ``qnext-gdn``, ...)."""
    if name in PRESETS:
        return PRESETS[name]
    from sglang_replayssm.models.specs import SPECS

    if name in SPECS:
        return spec_preset(name)
    raise ValueError(f"unknown model {name!r}; choose from {', '.join([*PRESETS, *SPECS])}")


def cache_params(model: ModelPreset, tp: int) -> Any:
    """SGLang's cache params of one TP rank: fp32 SSM state, the conv window in the serving dtype."""
    import torch
    from sglang.srt.configs.mamba_utils import (
        KimiLinearCacheParams,
        KimiLinearStateShape,
        Mamba2CacheParams,
        Mamba2StateDType,
        Mamba2StateShape,
    )

    dtype = Mamba2StateDType(conv=getattr(torch, model.dtype), temporal=torch.float32)
    layers = list(range(model.linear_layers))
    if model.family == "kda":
        shape = KimiLinearStateShape.create(
            tp_world_size=tp, num_heads=model.num_v_heads, head_dim=model.head_v_dim,
            num_k_heads=model.num_k_heads, head_k_dim=model.head_k_dim, conv_kernel_size=model.conv_kernel)
        return KimiLinearCacheParams(shape=shape, layers=layers, dtype=dtype)
    shape = Mamba2StateShape.create(
        tp_world_size=tp, intermediate_size=model.num_v_heads * model.head_v_dim, n_groups=model.num_k_heads,
        num_heads=model.num_v_heads, head_dim=model.head_v_dim, state_size=model.head_k_dim,
        conv_kernel=model.conv_kernel)
    return Mamba2CacheParams(shape=shape, layers=layers, dtype=dtype)


def kv_bytes_per_token(model: ModelPreset, tp: int, kv_itemsize: int) -> int:
    """KV cache bytes of one token on one rank, as SGLang's pool configurator sizes a cell: MHA
    ``max(kv_heads // tp, 1) * (head_dim + v_head_dim) * layers * itemsize`` (KV heads replicated past
    their count); MLA ``(kv_lora_rank + qk_rope_head_dim) * layers * itemsize`` (the latent, every rank)."""
    if model.kv_lora_rank:
        return (model.kv_lora_rank + model.qk_rope_head_dim) * model.attention_layers * kv_itemsize
    return max(model.kv_heads // tp, 1) * 2 * model.head_dim * model.attention_layers * kv_itemsize


@dataclass(frozen=True)
class Sizes:
    """Bytes per unit of each kind of cache on one rank."""

    state: int  # one state slot (SGLang's mamba_cache_per_req: conv window + SSM state, every linear layer)
    ring: int  # the decode ring of one slot (ReplaySSM on)
    record_per_token: int  # one token of records (every linear layer)
    interval_state: int  # one interval state (0 where none is kept: h not exact in the record dtype)
    interval: int
    kv_per_token: int
    params: Any = field(default=None, repr=False, compare=False)  # SGLang's cache params of the rank
    itemsize: int = 0  # bytes of one record value

    @property
    def ring_row(self) -> int:
        """One decode ring without its cursor (a request row's ring with ``SGLANG_REPLAYSSM_RING_ROWS``)."""
        return self.ring - 4  # ``ring`` holds the int32 cursor too (radix/budget.py)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in asdict(self).items() if k not in ("params", "itemsize")}


def sizes(model: ModelPreset, tp: int = 1, *, record_dtype: str | None = None, kv_dtype: str | None = None,
          ring_len: int = DEFAULT_RING_LEN, interval: int = DEFAULT_STATE_INTERVAL) -> Sizes:
    """Each kind's bytes on one rank. Interval states are kept only where the records' ``h`` is exact (GDN
    with records in the state dtype), as ``radix/records/budget.py`` keeps them."""
    params = cache_params(model, tp)
    itemsize = DTYPE_BYTES[record_dtype or model.dtype]
    exact_h = model.family == "gdn" and itemsize == params.dtype.temporal.itemsize
    interval = interval if exact_h else 0
    return Sizes(
        state=params.mamba_cache_per_req,
        ring=decode_ring_bytes_per_slot(params, ring_len),
        record_per_token=record_bytes_per_token(params, itemsize),
        interval_state=interval_state_bytes(params) if interval else 0,
        interval=interval,
        kv_per_token=kv_bytes_per_token(model, tp, DTYPE_BYTES[kv_dtype or model.dtype]),
        params=params,
        itemsize=itemsize,
    )


@dataclass(frozen=True)
class Split:
    """One policy's use of the budget: counts and bytes of each kind (``refused``: the budget cannot hold it)."""

    policy: str
    state_slots: int
    state_bytes: int
    record_tokens: int
    record_bytes: int
    kv_tokens: int
    kv_bytes: int
    refused: str = ""
    reason: str = ""  # the default rule's reason (records-default)

    @property
    def total_bytes(self) -> int:
        return self.state_bytes + self.record_bytes + self.kv_bytes


def _mamba_pool(budget: int, per_slot: int, ratio: float) -> tuple[int, int]:
    """SGLang's auto-fit (``KVCacheConfigurator._handle_max_mamba_cache``, no speculative decoding):
    ``size = (budget * ratio / (1 + ratio) - per_slot) // per_slot`` slots, ``size + 1`` allocated (the
    padding slot). Returns ``(size, bytes)``."""
    slots = max(int((budget * ratio / (1 + ratio) - per_slot) // per_slot), 0)
    return slots, (slots + 1) * per_slot if slots else 0


def default_record_tokens(rest: int, per_token: int, kv_per_token: int = 0) -> tuple[int, str]:
    """The default record capacity out of ``rest`` bytes left for the KV cache and why (the rule of
    ``radix/records/budget.py``, :func:`default_record_policy`: off where a token of records costs too
    many tokens of KV, else at least its paying capacity, at most :data:`DEFAULT_RECORD_SHARE` of the rest,
    none below :data:`MIN_RECORD_TOKENS`). ``per_token`` includes the interval states' share."""
    return default_record_policy(DEFAULT_RECORD_TOKENS, rest, per_token, kv_per_token)


def ring_charge(s: Sizes, slots_per_request: int) -> tuple[int, int]:
    """The decode ring's bytes ``(per slot, fixed)`` as ``radix/budget.py`` charges them: one ring per slot,
    or with rings keyed by request row (``SGLANG_REPLAYSSM_RING_ROWS``; ``slots_per_request`` > 0 is SGLang's
    state slots per running request, 3 for no_buffer, 5 for extra_buffer with overlap) ``ceil(ring /
    slots_per_request)`` plus the cursor and map entry per slot and the padding row fixed."""
    if slots_per_request <= 0:
        return s.ring, 0
    return -(-s.ring_row // slots_per_request) + 8, s.ring_row


def split(s: Sizes, budget: int, policy: str, *, record_tokens: int | None = None,
          ratio: float = MAMBA_FULL_MEMORY_RATIO, ring_rows: int = 0) -> Split:
    """One policy's split of ``budget`` bytes. ``policy``: ``"sglang"`` (extra_buffer, ReplaySSM off),
    ``"records-off"`` (the plugin: decode ring, no records) or ``"records"`` (the plugin with
    ``record_tokens`` tokens of records; None: the default rule). ``ring_rows`` > 0: the plugin's rings are
    keyed by request row with that many state slots per request (:func:`ring_charge`)."""
    ring, fixed = (0, 0) if policy == "sglang" else ring_charge(s, ring_rows)
    slots, state_bytes = _mamba_pool(budget, s.state + ring, ratio)
    state_bytes += fixed if slots else 0
    rest = budget - state_bytes
    name, tokens, nbytes, refused, reason = policy, 0, 0, "", ""
    if policy == "records":
        per_token = s.record_per_token + (-(-s.interval_state // s.interval) if s.interval else 0)
        if record_tokens is None:
            name = "records-default"
            tokens, reason = default_record_tokens(rest, per_token, s.kv_per_token)
        else:
            name, tokens = f"records-{record_tokens}", record_tokens
        nbytes = record_bytes(s.params, s.itemsize, tokens, s.interval) if tokens > 0 else 0
        if tokens > 0 and nbytes >= rest:
            refused = f"{tokens} tokens of records need {nbytes / GIB:.2f} GiB of the {rest / GIB:.2f} GiB left"
            tokens, nbytes = 0, 0
    elif policy not in ("sglang", "records-off"):
        raise ValueError(f"unknown policy {policy!r}")
    kv_tokens = max(rest - nbytes, 0) // s.kv_per_token
    return Split(name, slots, state_bytes, tokens, nbytes, kv_tokens, kv_tokens * s.kv_per_token, refused, reason)


DEFAULT_RECORD_BUDGETS = (4096, 16384, 65536)


def plan(model: ModelPreset, tp: int, budget: int, *, record_dtype: str | None = None, kv_dtype: str | None = None,
         record_budgets: tuple[int, ...] = DEFAULT_RECORD_BUDGETS, ring_len: int = DEFAULT_RING_LEN,
         interval: int = DEFAULT_STATE_INTERVAL, ring_rows: int = 0) -> dict[str, Any]:
    """Every policy's split of ``budget`` bytes on one rank, with the sizes behind it (a JSON-able dict);
    ``ring_rows`` > 0: the plugin's rings keyed by request row (:func:`split`)."""
    s = sizes(model, tp, record_dtype=record_dtype, kv_dtype=kv_dtype, ring_len=ring_len, interval=interval)
    splits = [split(s, budget, "sglang"), split(s, budget, "records-off", ring_rows=ring_rows),
              split(s, budget, "records", ring_rows=ring_rows)]
    splits += [split(s, budget, "records", record_tokens=n, ring_rows=ring_rows) for n in record_budgets]
    return {
        "model": asdict(model),
        "tp": tp,
        "ring_rows": ring_rows,
        "budget_bytes": budget,
        "record_dtype": record_dtype or model.dtype,
        "kv_dtype": kv_dtype or model.dtype,
        "sizes": s.as_dict(),
        "state_in_record_tokens": s.state / s.record_per_token,
        "state_in_kv_tokens": s.state / s.kv_per_token,
        "policies": [{**asdict(x), "total_bytes": x.total_bytes} for x in splits],
    }


def _gib(n: int) -> str:
    return f"{n / GIB:.2f}"


def format_plan(doc: dict[str, Any]) -> str:
    """The plan as text: the sizes, the exchange rate of a state, one row per policy."""
    s, m = doc["sizes"], doc["model"]
    lines = [
        f"{m['name']} ({m['family']}, {m['linear_layers']} linear + {m['attention_layers']} attention layers), "
        f"TP {doc['tp']}, {_gib(doc['budget_bytes'])} GiB of cache per rank; records {doc['record_dtype']}, "
        f"KV {doc['kv_dtype']}",
        f"per rank: a state {s['state']:,} B (+ ring {s['ring']:,} B with ReplaySSM"
        + (f"; rings keyed by request row, {doc['ring_rows']} slots per request" if doc.get("ring_rows") else "")
        + "), records "
        f"{s['record_per_token']:,} B/token, KV {s['kv_per_token']:,} B/token"
        + (f", an interval state {s['interval_state']:,} B per {s['interval']} tokens" if s["interval"] else ""),
        f"a state = {doc['state_in_record_tokens']:,.0f} tokens of records = {doc['state_in_kv_tokens']:,.0f} "
        f"tokens of KV",
        "",
        f"{'policy':<16} {'state slots':>11} {'GiB':>7} {'record tok':>10} {'GiB':>7} {'KV tokens':>11} {'GiB':>7}"
        f" {'total GiB':>9}",
    ]
    for p in doc["policies"]:
        lines.append(
            f"{p['policy']:<16} {p['state_slots']:>11,} {_gib(p['state_bytes']):>7} {p['record_tokens']:>10,} "
            f"{_gib(p['record_bytes']):>7} {p['kv_tokens']:>11,} {_gib(p['kv_bytes']):>7} {_gib(p['total_bytes']):>9}"
            + (f"  refused: {p['refused']}" if p["refused"] else "")
            + (f"  ({p['reason']})" if p.get("reason") else ""))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sglang-replayssm plan", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen3-next-80b",
                   help=f"a preset ({', '.join(PRESETS)}) or an embedded model (small-gdn, qnext-gdn, kimi-kda, ...)")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (the plan is per rank)")
    budget = p.add_mutually_exclusive_group()
    budget.add_argument("--cache-gib", type=float, help="GiB of HBM one rank gives to its caches (default 40)")
    budget.add_argument("--gpu-gib", type=float,
                        help="GiB of one GPU; the caches get --mem-fraction-static of it less the rank's weights")
    p.add_argument("--weights-gib", type=float, default=0.0, help="the whole model's weights, GiB (split over TP)")
    p.add_argument("--mem-fraction-static", type=float, default=0.9)
    p.add_argument("--record-dtype", choices=sorted(DTYPE_BYTES), help="records' dtype (default: the model's)")
    p.add_argument("--kv-dtype", choices=sorted(DTYPE_BYTES), help="KV cache dtype (default: the model's)")
    p.add_argument("--record-budgets", default=",".join(map(str, DEFAULT_RECORD_BUDGETS)),
                   help="comma-separated record capacities (tokens) to plan beside the default rule")
    p.add_argument("--ring-len", type=int, default=DEFAULT_RING_LEN, help="--linear-replayssm-cache-len")
    p.add_argument("--ring-rows", type=int, default=5, metavar="SLOTS_PER_REQUEST",
                   help="rings keyed by request row (SGLANG_REPLAYSSM_RING_ROWS, auto by default), with SGLang's "
                        "state slots per request (default 5: extra_buffer with overlap; 3: no_buffer); 0: a ring per "
                        "slot (RING_ROWS=off, or the read copy / PD / speculative decoding)")
    p.add_argument("--json", type=Path, help="also write the plan here as JSON")
    return p


def cache_budget(args: argparse.Namespace) -> int:
    """Bytes one rank gives to its caches: ``--cache-gib``, or ``--gpu-gib * --mem-fraction-static`` less
    the rank's share of ``--weights-gib`` (activations and CUDA graphs not counted)."""
    if args.gpu_gib is not None:
        gib = args.gpu_gib * args.mem_fraction_static - args.weights_gib / args.tp
    else:
        gib = 40.0 if args.cache_gib is None else args.cache_gib
    if gib <= 0:
        raise ValueError(f"no memory left for the caches ({gib:.2f} GiB)")
    return int(gib * GIB)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        budgets = tuple(int(x) for x in args.record_budgets.split(",") if x.strip())
        doc = plan(preset(args.model), args.tp, cache_budget(args), record_dtype=args.record_dtype,
                   kv_dtype=args.kv_dtype, record_budgets=budgets, ring_len=args.ring_len, ring_rows=args.ring_rows)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(format_plan(doc))
    if args.json is not None:
        args.json.write_text(json.dumps(doc, indent=2) + "\n")
    return 0
