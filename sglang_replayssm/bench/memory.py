"""Equal memory and the bytes each arm's server spends on its caches (``--equal-memory-mib``, ``rag-mem``).

Equal memory: every arm gets the same cache bytes ``B`` (KV + mamba states + decode ring + records). Each
arm's split of ``B`` is ``sglang-replayssm plan``'s (:func:`sglang_replayssm.bench.plan.split`: SGLang's
auto-fit share for the state slots, the plugin's ``default_record_policy`` for records out of the rest, the
rest KV), at the byte sizes of the served model (:func:`sglang_replayssm.bench.plan.sizes`, from SGLang's own
cache params and ``radix/records/budget.py``), turned into the server flags that pin it:
``--max-mamba-cache-size`` (slots), ``--max-total-tokens`` (KV tokens) and ``SGLANG_REPLAYSSM_RECORD_TOKENS``
(records). Invariant: each arm's ``state + ring + record + kv`` bytes are at most ``B``.

Spent bytes: read back from the server's startup log (SGLang's ``Mamba Cache is allocated.
max_mamba_cache_size: N`` and ``KV Cache is allocated. ... #tokens: N``; the plugin's ``records: N tokens of
layer inputs ..., a prefill state every I tokens``; SGLang's ``ring buffers allocated``, or the plugin's
``decode rings for N request rows``) and ``/metrics``
(``sglang:replayssm_record_pool_bytes``), priced at the same per-unit sizes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sglang_replayssm.bench.arms import Arm
from sglang_replayssm.bench.plan import (
    MAMBA_FULL_MEMORY_RATIO,
    ModelPreset,
    Sizes,
    Split,
    preset,
    sizes,
    split,
)
from sglang_replayssm.radix.records.budget import record_bytes
from sglang_replayssm.radix.ring.rows import uncovered_feature
from sglang_replayssm.settings import READ_COPY, RING_ROWS

MIB = 1 << 20
#: rag-mem's defaults: many zipf-reused documents, three turns, and (launched arms) equal memory at
#: :data:`RAG_MEM_MIB`, which holds less than half its working set in every arm (tests/test_bench_memory.py).
RAG_MEM_DEFAULTS: dict[str, Any] = {"rag_num_docs": 32, "rag_system_prompt_len": 200, "rag_num_conversations": 48,
                                    "rag_num_turns": 3, "gsp_range_ratio": 0.5, "gsp_group_distribution": "zipf",
                                    "gsp_zipf_alpha": 0.8}
RAG_MEM_MIB = 36.0
#: The other datasets' defaults of the same flags (the bench's defaults before rag-mem existed).
OTHER_DEFAULTS: dict[str, Any] = {"rag_num_docs": 4, "rag_system_prompt_len": 256, "rag_num_conversations": 8,
                                  "rag_num_turns": 2, "gsp_range_ratio": 1.0, "gsp_group_distribution": "uniform"}
RECORD_TOKENS_ENV = "SGLANG_REPLAYSSM_RECORD_TOKENS"
#: The arms equal memory can size: ReplaySSM off (SGLang's pool), the ring alone, the ring with records.
POLICY_OF_ARM = {"baseline": "sglang", "baseline-aa": "sglang", "upstream": "records-off", "plugin": "records",
                 "plugin-rows": "records", "plugin-slots": "records"}


def slots_per_request(arm: Arm, overlap: bool) -> int:
    """The state slots SGLang counts per running request for ``arm`` (``KVCacheConfigurator.
    _calculate_mamba_ratio``, no decode-lock skip): its base ratio plus the extra_buffer's tracking slots."""
    from sglang.srt.mem_cache.allocation_sizing import get_mamba_tracking_slots
    from sglang.srt.mem_cache.kv_cache_configurator import MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO

    flags = " ".join(arm.flags)
    return MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO + get_mamba_tracking_slots(
        extra_buffer="extra_buffer" in flags, overlap=overlap, lazy="extra_buffer_lazy" in flags)


def ring_rows_of(arm: Arm, overlap: bool) -> int:
    """``plan.split``'s ``ring_rows`` for ``arm``: its slots per request when it keys rings by request row
    (``SGLANG_REPLAYSSM_RING_ROWS`` on, or ``auto`` where the admission takes rows: the decode ring without the
    read copy), else 0."""
    env = dict(arm.env)
    mode = RING_ROWS.parse(env.get(RING_ROWS.name) or RING_ROWS.text() or RING_ROWS.default)
    covered = "--enable-linear-replayssm" in arm.flags and uncovered_feature(env.get(READ_COPY.name, "off")) is None
    return slots_per_request(arm, overlap) if mode == "on" or (mode.startswith("auto") and covered) else 0


class EqualMemoryError(ValueError):
    """An arm or a budget equal memory cannot size."""


@dataclass(frozen=True)
class ArmBudget:
    """One arm's share of the equal budget and the flags / variables that pin it on its server."""

    arm: str
    split: Split
    ring_bytes: int  # the decode ring of every slot (inside ``split.state_bytes``)
    flags: tuple[str, ...]
    env: tuple[tuple[str, str], ...]

    def as_dict(self) -> dict[str, Any]:
        s = self.split
        return {"policy": s.policy, "state_slots": s.state_slots, "state_bytes": s.state_bytes - self.ring_bytes,
                "ring_bytes": self.ring_bytes, "record_tokens": s.record_tokens, "record_bytes": s.record_bytes,
                "kv_tokens": s.kv_tokens, "kv_bytes": s.kv_bytes, "total_bytes": s.total_bytes,
                "flags": list(self.flags), "env": dict(self.env), "refused": s.refused, "reason": s.reason}


def model_sizes(model_name: str, dtype: str, interval: int) -> tuple[ModelPreset, Sizes]:
    """The per-unit bytes of an embedded model (by name) served in ``dtype`` (records and KV in it)."""
    model = preset(model_name)
    return model, sizes(model, 1, record_dtype=dtype, kv_dtype=dtype, interval=interval)


def arm_budget(arm: Arm, s: Sizes, budget: int, *, ratio: float = MAMBA_FULL_MEMORY_RATIO,
               record_tokens: int | None = None, overlap: bool = False) -> ArmBudget:
    """``arm``'s split of ``budget`` bytes (:func:`plan.split`, ``record_tokens`` None: the default rule;
    ``overlap``: whether its server schedules with overlap, which sets a rows arm's slots per request)."""
    policy = POLICY_OF_ARM.get(arm.name)
    if policy is None:
        raise EqualMemoryError(f"equal memory sizes the arms {', '.join(POLICY_OF_ARM)}; not {arm.name}")
    rows = ring_rows_of(arm, overlap)
    sp = split(s, budget, policy, record_tokens=record_tokens if policy == "records" else None, ratio=ratio,
               ring_rows=rows)
    if sp.state_slots < 4 or sp.kv_tokens <= 0:
        raise EqualMemoryError(f"{budget / MIB:.1f} MiB leave arm {arm.name} {sp.state_slots} state slots and "
                               f"{sp.kv_tokens} KV tokens; raise --equal-memory-mib")
    if sp.refused:
        raise EqualMemoryError(f"arm {arm.name}: {sp.refused}")
    if policy == "sglang":
        ring = 0
    elif rows:  # one ring per request row (at most slots // rows + 1 of them), a cursor and map entry per slot
        ring = (sp.state_slots // rows + 1) * s.ring_row + (sp.state_slots + 1) * 8
    else:
        ring = (sp.state_slots + 1) * s.ring
    flags = ("--max-mamba-cache-size", str(sp.state_slots), "--max-total-tokens", str(sp.kv_tokens))
    env = ((RECORD_TOKENS_ENV, str(sp.record_tokens)),) if policy == "records" else ()
    return ArmBudget(arm.name, sp, ring, flags, env)


def format_budgets(budgets: list[ArmBudget], budget: int, working_set: int | None = None) -> str:
    """The per-arm split as text, one line per arm (MiB and counts)."""
    lines = [f"equal memory: {budget / MIB:.1f} MiB of cache per arm (KV + states + ring + records)"]
    for b in budgets:
        d = b.as_dict()
        lines.append(
            f"  {b.arm:<9} states {d['state_slots']:>4} slots {d['state_bytes'] / MIB:6.1f} MiB | ring "
            f"{d['ring_bytes'] / MIB:5.1f} MiB | records {d['record_tokens']:>6} tok {d['record_bytes'] / MIB:6.1f} "
            f"MiB | KV {d['kv_tokens']:>6} tok {d['kv_bytes'] / MIB:6.1f} MiB | total {d['total_bytes'] / MIB:6.1f} MiB"
            + (f"  ({d['reason']})" if d["reason"] else ""))
    if working_set is not None and budgets:
        most = max(b.split.kv_tokens for b in budgets)
        lines.append(f"  working set {working_set} tokens = {working_set / most:.1f}x the most KV tokens an arm holds")
    return "\n".join(lines)


_MAMBA = re.compile(r"Mamba Cache is allocated\. max_mamba_cache_size: (\d+)")
_KV = re.compile(r"KV Cache is allocated\..*#tokens: (\d+)")
_RECORDS = re.compile(r"sglang-replayssm records: (\d+) tokens of layer inputs.*a prefill state every (\d+|-)")
_RING = re.compile(r"ReplaySSM ring buffers allocated")
_RING_ROWS = re.compile(r"sglang-replayssm: decode rings for (\d+) request rows")


def spent_from_log(text: str, s: Sizes, pool_bytes: float | None = None) -> dict[str, Any]:
    """The cache bytes a server's startup log says it allocated, priced at ``s``: ``kv_tokens``,
    ``state_slots``, ``record_tokens`` and ``*_bytes`` of each kind plus ``total_bytes`` (None where the log
    lacks a line). ``pool_bytes``: the server's ``sglang:replayssm_record_pool_bytes``, preferred when given."""
    out: dict[str, Any] = {}
    kv = _KV.findall(text)
    mamba = _MAMBA.findall(text)
    rec = _RECORDS.findall(text)
    out["kv_tokens"] = int(kv[-1]) if kv else None
    out["kv_bytes"] = None if not kv else int(kv[-1]) * s.kv_per_token
    slots = int(mamba[-1]) if mamba else None
    out["state_slots"] = slots
    # SGLang allocates max_mamba_cache_size + 1 slots (the padding slot); the ring rides every slot.
    out["state_bytes"] = None if slots is None else (slots + 1) * s.state
    rows = _RING_ROWS.findall(text)
    if slots is not None and rows:  # rings keyed by request row: one ring a row, a cursor and map entry a slot
        out["ring_bytes"] = int(rows[-1]) * s.ring_row + (slots + 1) * 8
    else:
        out["ring_bytes"] = (slots + 1) * s.ring if slots is not None and _RING.search(text) else 0
    tokens = int(rec[-1][0]) if rec else 0
    interval = int(rec[-1][1]) if rec and rec[-1][1] != "-" else 0
    out["record_tokens"] = tokens
    if pool_bytes:
        out["record_bytes"] = int(pool_bytes)
    else:
        out["record_bytes"] = record_bytes(s.params, s.itemsize, tokens, interval) if tokens else 0
    parts = [out[k] for k in ("kv_bytes", "state_bytes", "ring_bytes", "record_bytes")]
    out["total_bytes"] = None if any(p is None for p in parts) else sum(parts)
    return out


def working_set_tokens(conversations: Any) -> int:
    """Distinct tokens the workload puts in a prefix cache: the distinct prefixes of every turn-0 prompt (a
    token trie: shared system prompts and documents count once), each later turn's new tokens, and each
    turn's answer at its ``output_len`` (the answers themselves come from the server)."""
    root: dict[int, Any] = {}
    total = 0
    for conv in conversations:
        for t, turn in enumerate(conv.turns):
            total += turn.output_len
            if t > 0:
                total += len(turn.new_ids)
                continue
            node = root
            for tok in turn.new_ids:
                nxt = node.get(tok)
                if nxt is None:
                    nxt = node[tok] = {}
                    total += 1
                node = nxt
    return total


def served_sizes(model_name: str, device: str, extra_args: list[str]) -> Sizes | None:
    """Per-unit bytes of the model the bench launches (an embedded model, by directory name), in the dtype the
    servers run: ``--dtype`` from ``extra_args``, else float32 on CPU (``cpu/launch.py``), else the model's;
    None for a model that is not embedded (no preset to size it)."""
    from sglang_replayssm.radix.records.interval_states import interval_from_env

    try:
        model = preset(model_name)
    except ValueError:
        return None
    dtype = "float32" if device == "cpu" else model.dtype
    for i, tok in enumerate(extra_args):
        if tok == "--dtype" and i + 1 < len(extra_args):
            dtype = extra_args[i + 1]
        elif tok.startswith("--dtype="):
            dtype = tok.split("=", 1)[1]
    if dtype not in ("float32", "bfloat16", "float16"):
        return None
    return sizes(model, 1, record_dtype=dtype, kv_dtype=dtype, interval=interval_from_env())


def record_pool_bytes(base_url: str, timeout_s: float = 10.0) -> float | None:
    """The server's ``sglang:replayssm_record_pool_bytes`` gauge (None: no page or no sample)."""
    import urllib.request

    from sglang_replayssm.bench.server_metrics import metric_sums

    try:
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as resp:
            text = resp.read().decode(errors="replace")
    except OSError:
        return None
    return metric_sums(text).get("sglang:replayssm_record_pool_bytes")


def format_spent(arms: dict[str, dict[str, Any]]) -> str:
    """Per arm the cache bytes its server spent (``arms[name]["cache_bytes"]``) beside hit rate, ceiling
    and TTFT p50 / p90; empty when no arm has them."""
    rows = [(n, a) for n, a in arms.items() if a.get("cache_bytes")]
    if not rows:
        return ""

    def mib(x: Any) -> str:
        return "-" if x is None else f"{x / MIB:.1f}"

    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    def ms(x: Any) -> str:
        return "-" if x is None else f"{1000 * x:.0f}"

    out = [f"{'arm':<10} {'KV tok':>7} {'KV MiB':>7} {'slots':>5} {'state MiB':>9} {'ring MiB':>8} {'rec tok':>7} "
           f"{'rec MiB':>7} {'total MiB':>9} {'hit':>6} {'ceiling':>7} {'p50 ms':>6} {'p90 ms':>6}"]
    for name, a in rows:
        b = a["cache_bytes"]
        out.append(f"{name:<10} {b['kv_tokens'] or 0:>7} {mib(b['kv_bytes']):>7} {b['state_slots'] or 0:>5} "
                   f"{mib(b['state_bytes']):>9} {mib(b['ring_bytes']):>8} {b['record_tokens']:>7} "
                   f"{mib(b['record_bytes']):>7} {mib(b['total_bytes']):>9} {pct(a.get('hit_rate')):>6} "
                   f"{pct(a.get('ceiling_hit_rate')):>7} {ms(a.get('ttft_p50_s')):>6} {ms(a.get('ttft_p90_s')):>6}")
    return "\n".join(out)


def resolve_defaults(args: Any) -> None:
    """Fill the bench's workload flags left unset (None) with the dataset's defaults (rag-mem's differ), and
    turn equal memory on for rag-mem's launched arms."""
    mem = args.dataset_name == "rag-mem"
    for key, value in (RAG_MEM_DEFAULTS if mem else OTHER_DEFAULTS).items():
        if key == "gsp_zipf_alpha":
            if args.gsp_zipf_alpha is None and args.gsp_group_distribution == "zipf":
                args.gsp_zipf_alpha = value
        elif getattr(args, key) is None:
            setattr(args, key, value)
    if mem and args.equal_memory_mib is None and args.url is None:
        args.equal_memory_mib = RAG_MEM_MIB


def equal_memory(args: Any, names: list[str], model_name: str, conversations: Any
                 ) -> tuple[Sizes | None, dict[str, ArmBudget], dict[str, Any] | None, str]:
    """The served model's unit sizes and, with ``args.equal_memory_mib``, every arm's budget, the JSON
    document and the text to print; EqualMemoryError where equal memory cannot size the run."""
    import shlex

    from sglang_replayssm.bench.arms import ARMS

    extra = [tok for s in args.server_args for tok in shlex.split(s)]
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    s = served_sizes(model_name, device, extra)
    if args.equal_memory_mib is None:
        return s, {}, None, ""
    if args.url is not None or s is None:
        raise EqualMemoryError("--equal-memory-mib sizes launched arms of an embedded model (not --url)")
    budget = int(args.equal_memory_mib * MIB)
    overlap = device != "cpu" and "--disable-overlap-schedule" not in extra  # the arms' common flags (arms.py)
    budgets = {n: arm_budget(ARMS[n], s, budget, ratio=args.equal_memory_state_ratio,
                             record_tokens=args.equal_memory_record_tokens, overlap=overlap) for n in names}
    ws = working_set_tokens(conversations)
    doc = {"budget_bytes": budget, "working_set_tokens": ws, "sizes": s.as_dict(),
           "arms": {n: b.as_dict() for n, b in budgets.items()}}
    return s, budgets, doc, format_budgets(list(budgets.values()), budget, ws)


def spent_bytes(s: Sizes | None, log_path: Any, base_url: str) -> dict[str, Any] | None:
    """The cache bytes one arm's server allocated (:func:`spent_from_log` of its log, records from its
    ``/metrics``); None where the model cannot be priced."""
    if s is None:
        return None
    text = log_path.read_text(errors="replace") if log_path.exists() else ""
    return spent_from_log(text, s, record_pool_bytes(base_url))
