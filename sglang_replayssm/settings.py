"""Every switch of sglang-replayssm in one registry: its environment variables and its fixes.

* :data:`SETTINGS`: each ``SGLANG_REPLAYSSM_*`` variable as a :class:`Setting` (name, type, default,
  parser, one-line doc, group). Product code reads a variable only through its setting
  (``RECORD_TOKENS.value()``), which parses the environment on every call, so a test that changes the
  environment sees the change; radix/config.py caches the fixes' on/off state on top of this.
* :data:`FIXES`: each fix of the adapter and of the CPU runtime as a :class:`Fix` (on by default,
  turned off by name through :data:`DISABLE_FIXES`; ``runtime`` fixes stay on with ``ADAPTER=0``).

Invariants: a bad value is one ``ValueError`` line ``NAME='text': expected ...`` naming the variable
and what it accepts; :func:`validate` (run by the plugin's entry points, plugin.py) refuses the first
one at startup; an unset or empty variable is its default. README's switch table is
:func:`markdown_table` (``sglang-replayssm settings``; tests/test_settings.py fails on drift).
This module imports nothing of the package, so any layer (kernels included) may read it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

__all__ = [
    "FIXES", "SETTINGS", "Fix", "Setting", "by_name", "main", "markdown_table", "validate",
    "ADAPTER", "CPU_RUNTIME", "CUDA_CACHE", "CUDA_KERNELS", "DISABLE_FIXES", "HOST_RECORD_TOKENS", "READ_COPY",
    "STATE_INTERVAL_ROUNDED",
    "READ_COPY_MODES", "REBUILD_SEQUENTIAL_TOKENS", "RECORD_TOKENS", "RING_ROWS", "RING_TRACE", "STATE_INTERVAL",
]  # fmt: skip

T = TypeVar("T")
PREFIX = "SGLANG_REPLAYSSM_"


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One environment variable: ``parse`` turns its stripped text into the value or raises a
    ``ValueError`` whose text starts with ``expected``; ``shown_default`` is the default as the table
    shows it (when ``default`` alone does not say it, e.g. None for "the budget's")."""

    name: str
    type: str
    default: T
    parse: Callable[[str], T]
    doc: str
    group: str
    shown_default: str = ""

    def text(self) -> str | None:
        """The variable's stripped text, None when unset or empty."""
        text = os.environ.get(self.name, "").strip()
        return text or None

    def is_set(self) -> bool:
        return self.text() is not None

    def publish(self, text: str) -> None:
        """Set the variable in this process's environment, which every process it starts afterwards
        inherits (a value resolved once, at the admission, for the scheduler processes)."""
        self.parse(text)
        os.environ[self.name] = text

    def value(self) -> T:
        """The parsed value (the default when unset); a bad value is a one-line ``ValueError``."""
        text = self.text()
        if text is None:
            return self.default
        try:
            return self.parse(text)
        except ValueError as exc:
            raise ValueError(f"{self.name}={text!r}: {exc}") from None


@dataclass(frozen=True)
class Fix:
    """One fix: on unless named in :data:`DISABLE_FIXES`; a ``runtime`` fix (the CPU runtime's, not the
    adapter's) stays on with ``SGLANG_REPLAYSSM_ADAPTER=0``."""

    name: str
    group: str
    doc: str
    runtime: bool = False


# ---- parsers ----------------------------------------------------------------------------------------

_TRUE, _FALSE = ("1", "true", "on", "yes"), ("0", "false", "off", "no")


def _flag(text: str) -> bool:
    low = text.lower()
    if low not in _TRUE + _FALSE:
        raise ValueError(f"expected one of {', '.join(_TRUE + _FALSE)}")
    return low in _TRUE


def _tokens(zero_means: str) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"expected a number of tokens ({zero_means})") from None
        if value < 0:
            raise ValueError("expected >= 0 tokens")
        return value

    return parse


#: Chunk length of SGLang's chunked prefill kernels (radix/records/interval_states.py ``CHUNK``).
_CHUNK = 64


def _interval(text: str) -> int:
    value = _tokens("0 keeps no state")(text)
    if value % _CHUNK:
        raise ValueError(f"expected 0 or a positive multiple of {_CHUNK} tokens")
    return value


def _choice(*options: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.lower() not in options:
            raise ValueError(f"expected one of {', '.join(options)}")
        return text.lower()

    return parse


def _auto_flag(text: str) -> str:
    """``auto`` or a flag word, as ``auto`` / ``on`` / ``off``; ``auto:on`` / ``auto:off`` are an ``auto`` as
    the admission resolved it (still ``auto`` to the next admission)."""
    low = text.lower()
    if low in ("auto", "auto:on", "auto:off"):
        return low
    try:
        return "on" if _flag(text) else "off"
    except ValueError:
        raise ValueError(f"expected auto or one of {', '.join(_TRUE + _FALSE)}") from None


def _fix_names(text: str) -> frozenset[str]:
    names = {x.strip() for x in text.split(",") if x.strip()}
    unknown = names - {f.name for f in FIXES}
    if unknown:
        raise ValueError(f"unknown fix name(s) {sorted(unknown)}; expected names from {sorted(f.name for f in FIXES)}")
    return frozenset(names)


def _text(text: str) -> str:
    return text


# ---- the variables ---------------------------------------------------------------------------------

#: The values of :data:`READ_COPY` (``off``: no read copy, fp32 ring decode).
READ_COPY_MODES = ("off", "bf16", "fp8")

ADAPTER = Setting(f"{PREFIX}ADAPTER", "bool", True, _flag, "the radix adapter; off: SGLang's own behaviour (the "
                  "CPU runtime's fixes stay on), for A/B runs", "adapter")
DISABLE_FIXES = Setting(f"{PREFIX}DISABLE_FIXES", "fix names", frozenset[str](), _fix_names, "comma-separated fixes "
                        "to turn off (table below); a disabled fix's hook calls SGLang's function unchanged",
                        "adapter", "none")
CUDA_KERNELS = Setting(f"{PREFIX}CUDA_KERNELS", "bool", True, _flag, "on CUDA, the ring decode's CUDA passes "
                       "(kernels/csrc/ring_read.cu) where they fit; off: Triton (same results)", "ring")
CUDA_CACHE = Setting(f"{PREFIX}CUDA_CACHE", "path", Path.home() / ".cache" / "sglang-replayssm" / "cuda", Path,
                     "where the CUDA passes are built once with nvcc", "ring", "~/.cache/sglang-replayssm/cuda")
RECORD_TOKENS = Setting(f"{PREFIX}RECORD_TOKENS", "tokens", None, _tokens("0 turns records off"), "the record pool's "
                        "capacity (at most one per KV slot; reserved from the KV budget, logged at startup)",
                        "records", "16384, at most half the memory left for the KV cache")
STATE_INTERVAL = Setting(f"{PREFIX}STATE_INTERVAL", "tokens", 256, _interval, "keep a prefill state every N tokens "
                         "(a multiple of 64; 0 none; GDN and KDA prefills), so a rebuild folds < N + 64 "
                         "records", "records")
STATE_INTERVAL_ROUNDED = Setting(f"{PREFIX}STATE_INTERVAL_ROUNDED", "bool", True, _flag, "also keep the prefill "
                                 "states SGLang's extend kernel rounds to the activation dtype (bf16 serving), as computed (half an fp32 "
                                 "state's bytes; widened when a rebuild copies one into a slot): rebuilds fold < N + 64 "
                                 "records there too, from a state rounded once (H200: rebuilt-hit "
                                 "KL 0.0091 vs 0.0117 for an exact state; off: exact states only)", "records")
HOST_RECORD_TOKENS = Setting(f"{PREFIX}HOST_RECORD_TOKENS", "tokens", None, _tokens("0: no host records"),
                             "HiCache: the host record pool's capacity (at most the host KV pool's; 0 none)",
                             "records", "the device pool's")
REBUILD_SEQUENTIAL_TOKENS = Setting(f"{PREFIX}REBUILD_SEQUENTIAL_TOKENS", "tokens", 32,
                                    _tokens("0 always folds with the chunk kernels"), "on CUDA, unstacked rebuilds (KDA "
                                    "layers) whose spans all have at most N records fold token by token through "
                                    "SGLang's decode kernel, longer ones through its chunk kernels (0: always the chunk "
                                    "kernels); stacked GDN rebuilds always fold by chunks", "records")
READ_COPY = Setting(f"{PREFIX}READ_COPY", "off|bf16|fp8", "off", _choice(*READ_COPY_MODES), "non-flush decode steps read "
                    "a bf16 / fp8 copy of the fp32 checkpoint, flushes stay fp32-exact (radix/read_copy/store.py); needs "
                    "--enable-linear-replayssm and an fp32 checkpoint; refused with speculative decoding and the Helion "
                    "decode backend",
                    "read copy")
RING_ROWS = Setting(f"{PREFIX}RING_ROWS", "auto|on|off", "auto", _auto_flag, "decode rings only for running requests "
                    "(one per request row, not one per mamba slot): the slots' ring bytes go to more slots (on CUDA the "
                    "CUDA passes' row-map build, as fast as per-slot rings); on: refused with the read copy, Helion "
                    "and the KDA safe gate; auto: rows where covered, else a ring per "
                    "slot (one startup line says which and why)",
                    "ring")
CPU_RUNTIME = Setting(f"{PREFIX}CPU_RUNTIME", "bool", True, _flag, "without a CUDA driver, route `sgl_kernel` to the "
                      "torch stand-in (cpu/autoload.py); off: never", "cpu runtime")
RING_TRACE = Setting(f"{PREFIX}RING_TRACE", "path prefix", None, _text, "tests: each process appends its CPU ring "
                     "decode trace to `<prefix>.<pid>.jsonl` (cpu/decode_probe.py)", "cpu runtime", "off")
LAB_GPU = Setting(f"{PREFIX}LAB_GPU", "bool", False, _flag, "the lab H200 only: route `sgl_kernel` to the torch "
                  "stand-in (lab/gpu_serve/shim, set by scripts/gpu_serve.sh)", "lab")

#: Read by lab/, tests/ and scripts/ only (registered so the table lists every variable of ours).
_OUTSIDE = (
    Setting(f"{PREFIX}LAB_OPS_LOG", "path", None, _text, "lab shim: write the stand-in's op call counts here at exit",
            "lab", "off"),
    Setting(f"{PREFIX}LAB_PDL", "bool", False, _flag, "lab shim: report PDL launches as supported on sm_90", "lab"),
    Setting(f"{PREFIX}SLOW", "bool", False, _flag, "tests: run the opt-in slow server tests", "tests"),
    Setting(f"{PREFIX}MATRIX", "bool", False, _flag, "tests: run the launch matrix (tests/test_launch_matrix.py)",
            "tests"),
    Setting(f"{PREFIX}MATRIX_OUT", "path", Path("/tmp/launch_matrix.json"), Path, "tests: the launch matrix's JSON",
            "tests"),
    Setting(f"{PREFIX}SPEC_MODELS", "path", None, Path, "tests: a folder to build / reuse the spec models in", "tests",
            "a temporary folder"),
    Setting(f"{PREFIX}SGLANG_ROOT", "path", None, Path, "GPU tests and scripts: a folder holding SGLang's kernel "
            "files", "tests", "none"),
    Setting(f"{PREFIX}HF_REF_CACHE", "path", None, Path, "tests: the HF reference outputs' cache", "tests",
            "~/.cache/sglang-replayssm/hf-ref"),
    Setting(f"{PREFIX}CACHE", "path", None, Path, "scripts/ensure_env.sh: the virtualenvs' root", "tests",
            "~/.cache/sglang-replayssm"),
)

#: Every variable, in table order.
SETTINGS: tuple[Setting[Any], ...] = (
    ADAPTER, DISABLE_FIXES, CUDA_KERNELS, CUDA_CACHE, RING_ROWS, RECORD_TOKENS, STATE_INTERVAL, STATE_INTERVAL_ROUNDED,
    HOST_RECORD_TOKENS,
    REBUILD_SEQUENTIAL_TOKENS, READ_COPY, CPU_RUNTIME, RING_TRACE, LAB_GPU, *_OUTSIDE,
)  # fmt: skip


def by_name(name: str) -> Setting[Any]:
    """The setting of the variable ``name`` (a KeyError for a name not registered)."""
    for s in SETTINGS:
        if s.name == name:
            return s
    raise KeyError(name)


def validate() -> None:
    """Parse every variable the product reads: the first bad one is a one-line ``ValueError``
    (plugin.py refuses the start with it)."""
    for s in SETTINGS:
        if s not in _OUTSIDE:
            s.value()


# ---- the fixes -------------------------------------------------------------------------------------

FIXES: tuple[Fix, ...] = (
    Fix("admission", "ring", "admit extra_buffer / extra_buffer_lazy with --enable-linear-replayssm (GDN; KDA with "
        "a KDA snapshot fix); refuse --enable-mixed-chunk / --enable-streaming-session with the decode ring"),
    Fix("kda_force_flush", "ring", "KDA decode force-flushes the ring at track boundaries like GDN"),
    Fix("device_cursor", "ring", "advance the decode ring cursor and build the forced-flush mask on the device from "
        "the device seq_lens (no host sync, CUDA-graph safe) instead of SGLang's host-side advance"),
    Fix("cursor_reset", "ring", "every mamba slot handed out by the allocator (or loaded from an int8 "
        "checkpoint) starts with an empty ring"),
    Fix("materialize_copy", "ring", "MambaPool.copy_from folds the source's pending ring records into the copy "
        "(only while cursor_reset is on: a record count is trusted only if every slot starts empty)"),
    Fix("materialize_track", "ring", "the decode track snapshot folds the working slot's pending records"),
    Fix("track_flush_skip", "ring", "the decode track snapshot skips that fold (a launch per decode step) where the "
        "step's force flush already emptied every tracked row's ring (GDN; KDA with kda_force_flush)"),
    Fix("finish_donation", "ring", "no_buffer finish: materialise the full state, donate at the real depth"),
    Fix("ring_budget", "ring", "charge the decode ring to the mamba memory budget"),
    Fix("lost_hit_metric", "metrics", "count prompt tokens whose KV hit was dropped for lack of a mamba state"),
    Fix("leak_gauges", "metrics", "export gauges of what the plugin holds (record slots, kept states, planted "
        "states and locks, queued record jobs, non-empty rings, host record rows) where SGLang reports metrics"),
    Fix("ring_kernels", "ring", "on CUDA, run sglang-replayssm's Triton ring decode in place of SGLang's ReplaySSM "
        "kernel (same ring layout and semantics)"),
    Fix("extend_fold", "ring", "before an extend or MIXED forward, fold every row's pending ring records into its "
        "checkpoint (mixed-chunk decode rows, streaming-session turns); admits --enable-mixed-chunk and "
        "--enable-streaming-session with the decode ring"),
    Fix("retract_backup", "ring", "MambaPool.get_cpu_copy (CPU retraction backup) carries the full state, pending "
        "records folded in; load_cpu_copy leaves the destination with an empty ring"),
    Fix("record_hits", "records", "keep every computed token's linear-layer inputs (a budgeted record pool, "
        "SGLANG_REPLAYSSM_RECORD_TOKENS) so a prefix hit at any depth rebuilds the exact state from the "
        "deepest state above it (GDN, with the decode ring)"),
    Fix("record_spec_decode", "records", "speculative decode batches (NEXTN / EAGLE) assign no record slots: their "
        "out_cache_loc is an earlier forward's (schedule_batch.py:3754-3762, 3859-3861), so assigning it re-pointed "
        "cached prompt tokens at unwritten record slots (wrong rebuilt states); verify forwards capture nothing"),
    Fix("record_kda_graph_eager", "records", "KDA in breakable prefill graphs (SGLang's for GLM-5.3 Flash, not Kimi-"
        "Linear): its extend runs between segments, as GDN's, so records capture it (off: those prefills keep none)"),
    Fix("record_spec_ring", "records", "records also with the spec-verify ring (--enable-linear-replayssm-spec, GDN): "
        "capture, match and rebuild as with the decode ring (a planted tree slot has no row, so no spec cursors); "
        "end_state folds the finishing row's pending accepted records before it copies the working slot"),
    Fix("end_state", "ring", "extra_buffer finish: donate the exact state at the request's full depth (the "
        "working slot, pending records folded) instead of the last tracked state"),
    Fix("record_refresh", "records", "a hit planted from records moves the records it folds (from an interval state: "
        "the tail after it, conv lead included) to the young end of the first-in-first-out record pool (rows "
        "copied), so the branch points that keep being hit keep their records and other paths' tails stay"),
    Fix("end_state_branch", "records", "end_state keeps a tracked state at the request's branch point (SGLang's "
        "mamba_branching_seqlen: the match found KV past every state and no records to plant one), so the next "
        "request leaving there hits it even after its records are evicted; the end state is donated otherwise"),
    Fix("branch_on_prefix_grid", "records", "a match that resumes from a state off the chunk grid (an end state, a "
        "planted state) gets SGLang's branch point on its own prefix's grid (resume + k x chunk), so its prefill "
        "tracks a state there; SGLang's grid counted from token 0 is never tracked from such a prefix"),
    Fix("pd_decode_ring", "pd", "PD disaggregation: the decode server's mamba pool (HybridMambaDecodeReqToTokenPool) "
        "gets the decode ring and --disaggregation-mode decode is admitted with --enable-linear-replayssm "
        "(radix/pd.py); a prefill server is refused with the ring"),
    Fix("pd_hits", "pd", "PD decode server with its radix cache: log each admission's own prefix hit (the decode "
        "tree's device hit, host hit, mamba-lost hit) and the running decode hit rate (radix/pd_hits.py)"),
    # PD on the CPU runtime (cpu/hooks_pd.py): SGLang's prefill side records CUDA events on the host
    Fix("pd_host_indices", "cpu runtime", "CPU runtime, PD prefill: every KV sender takes SGLang's host page-index "
        "path (kv_to_page_indices) instead of a pinned D2H copy + CUDA event (no NVIDIA driver)", runtime=True),
    Fix("pd_early_send_event", "cpu runtime", "CPU runtime, PD prefill under overlap scheduling: a prefix hit's early "
        "KV send records no CUDA event (every CPU forward has finished when the scheduler gets control back: there "
        "is nothing to wait for)", runtime=True),
    # the spec-verify ring (--enable-linear-replayssm-spec, GDN; radix/spec_ring.py)
    Fix("spec_finish_donation", "spec", "spec ring, no_buffer finish: fold the row's pending accepted records before "
        "SGLang donates the slot (D1)"),
    Fix("spec_retract_backup", "spec", "spec ring: fold the row's pending accepted records before "
        "Req.offload_kv_cache backs the slot up to CPU (D2)"),
    Fix("spec_extend_fold", "spec", "spec ring: before an extend or MIXED forward, fold every row's pending accepted "
        "records (mixed-chunk decode rows, streaming-session turns; D3, D4)"),
    Fix("spec_ring_check", "spec", "refuse a GDN spec ring whose length is not a power of two or is < 2 x draft "
        "tokens at startup, in one line (D5)"),
    Fix("session_state_depth", "ring", "streaming session, a finished turn (no overlap): the kept record's committed "
        "length is the depth its KV and mamba state reached, not prompt + output (a speculative turn ending on "
        "a bonus token); a turn whose mamba state ran past its kept tokens (a verify past max_new_tokens or a "
        "stop) releases its slot, so the next turn starts from the radix tree"),
    Fix("reused_states_last", "eviction", "the tree's mamba states are evicted in segmented-LRU order: states of nodes "
        "at least two later requests went through (SGLang's hit_count; at most 60% of the state pool, the most recent) "
        "go after every other state, so branch points and shared prefixes outlive fresh end states; selects "
        "SGLang's Python TreeCore for a cache with mamba states (the Rust one keeps its order native)"),
    Fix("stateless_kv_first", "eviction", "KV eviction takes the leaves no hit can start from (no mamba state, no "
        "record at their first token, no session) first, SGLang's order within each; selects the Python TreeCore too"),
    Fix("record_hicache", "records", "HiCache: records go to host with their node's KV (a host record pool, "
        "SGLANG_REPLAYSSM_HOST_RECORD_TOKENS) and come back with it on load-back, so hits inside loaded-back "
        "nodes rebuild exactly; a planted state is locked and kept out of host backups until rebuilt; "
        "off: records are not used while HiCache is on"),
    Fix("planted_lock_budget", "records", "HiCache: a plant whose lock (held till its rebuild) would protect tokens "
        "the prefill round's adder already counted as evictable for a request it admitted is skipped (a lost hit), "
        "so prepare_for_extend cannot run out of KV with every tree token locked (radix/records/hicache/plant_budget.py)"),
    Fix("record_host_hits", "records", "HiCache: a match whose KV runs on into host-only nodes past its deepest "
        "(device) state, with host records covering them, is a host hit to the KV depth: the KV is loaded back, "
        "then the state planted and rebuilt from the records (radix/record_host_hits.py)"),
    Fix("record_storage", "records", "HiCache L3 storage (--hicache-storage-backend): a page's records are stored "
        "beside it through the same backend (key: page hash + layout) and come back as host records with a "
        "prefetch, so hits inside a prefetched span rebuild exactly (radix/record_storage.py)"),
    # the read copy (SGLANG_REPLAYSSM_READ_COPY, radix/read_copy/store.py); no effect while it is off
    Fix("read_copy_refresh", "read copy", "read copy: a slot whose checkpoint was written by anything but the flush "
        "(alloc, copy-on-write, HiCache load-back, load_cpu_copy, materialize, extend) is marked stale and its copy "
        "rewritten from the fp32 checkpoint by its next decode step, per layer"),
    Fix("read_copy_exact_fold", "read copy", "read copy: a mover that folds a slot's pending records (copy-on-write, "
        "track snapshot, extend fold, retraction backup) replays the raw records (k, g, v, beta) against the fp32 "
        "checkpoint, as the flush does, instead of folding the copy-based deltas"),
    Fix("read_copy_d_ring", "read copy", "read copy: with a 2-byte io dtype (bf16 / fp16) and SGLang's fp32 decode "
        "ring, the copy's d~ and v records live in SGLang's replayssm_d (dead while the copy is on: nothing else "
        "reads or writes it) as views, per slot [2, HV, L, V] of the io dtype, instead of a second allocation; the "
        "budget no longer charges them (off: allocated beside the ring and charged)"),
)


# ---- the README table --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _shown_default(s: Setting[Any]) -> str:
    if s.shown_default:
        return s.shown_default
    if isinstance(s.default, bool):
        return "1" if s.default else "0"
    return str(s.default)


def markdown_table() -> str:
    """README's switch table: every variable, then every fix (the text between README's markers)."""
    lines = ["| Variable | Group | Type | Default | What it does |", "|---|---|---|---|---|"]
    lines += [f"| `{s.name}` | {s.group} | {_cell(s.type)} | {_cell(_shown_default(s))} | {_cell(s.doc)} |"
              for s in SETTINGS]
    lines += ["", f"A bool takes {'/'.join(_TRUE)} or {'/'.join(_FALSE)}; tokens a number >= 0; a bad value "
              "refuses the start in one line. Fixes (all on; "
              f"`{DISABLE_FIXES.name}=a,b` turns single ones off; the cpu runtime's stay on with "
              f"`{ADAPTER.name}=0`):", "", "| Fix | Group | What it does |", "|---|---|---|"]
    lines += [f"| `{f.name}` | {f.group} | {_cell(f.doc)} |" for f in FIXES]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """``sglang-replayssm settings``: print :func:`markdown_table`; ``--check`` validates this
    environment instead (one line per bad variable, exit 1)."""
    if argv[:1] == ["--check"]:
        bad = []
        for s in SETTINGS:
            if s in _OUTSIDE:
                continue
            try:
                s.value()
            except ValueError as exc:
                bad.append(str(exc))
        print("\n".join(bad) or "sglang-replayssm: every setting is valid", file=sys.stderr if bad else sys.stdout)
        return 1 if bad else 0
    sys.stdout.write(markdown_table())
    return 0
