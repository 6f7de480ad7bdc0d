"""`sglang-replayssm bench`: prefix hit rate and TTFT of each arm on a shared-prefix workload.

Each arm gets its own real SGLang server (``python -m sglang.launch_server``), or the one the user
runs at ``--url``. Workload option names follow ``sglang.benchmark.serving``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from sglang_replayssm import __version__
from sglang_replayssm.bench.arms import ARMS, DEFAULT_ARMS, parse_arms
from sglang_replayssm.bench.ceiling import ceiling_hit_rate, ceiling_tokens
from sglang_replayssm.bench.memory import (
    RAG_MEM_MIB,
    EqualMemoryError,
    equal_memory,
    format_spent,
    resolve_defaults,
    spent_bytes,
)
from sglang_replayssm.bench.metrics import agreement
from sglang_replayssm.bench.model import (
    DEFAULT_MODEL,
    DEFAULT_MODELS_DIR,
    ModelError,
    mtp_fit_prompts,
    require_linear_attention,
    resolve_model_path,
    vocab_ids,
)
from sglang_replayssm.bench.records import RequestRecord
from sglang_replayssm.bench.report import arm_result, format_table, write_json
from sglang_replayssm.bench.ttft_bound import bounds, format_bounds
from sglang_replayssm.bench.workload import (
    Conversation,
    GspSpec,
    RagSpec,
    Turn,
    WorkloadError,
    describe,
    first_tokens,
    fitted_conversations,
    generate_gsp,
    generate_rag,
    warmup_requests,
)

URL_ARM = "url"


class BenchError(Exception):
    """Bad input: reported as one message, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="sglang-replayssm bench",
        description="Prefix hit rate, TTFT and greedy agreement of SGLang arms on a shared-prefix workload.",
    )
    g = p.add_argument_group("arms and servers")
    g.add_argument("--arms", default=None,
                   help=f"comma-separated subset of {','.join(ARMS)} (default: {','.join(DEFAULT_ARMS)}; "
                        "the nextn arms need a model with an MTP layer, e.g. tiny-gdn with --dataset-name mtp-fit); "
                        "with --url, one label for that server")
    g.add_argument("--url", "--base-url", dest="url", default=None,
                   help="benchmark the SGLang server already running here instead of launching one per arm")
    g.add_argument("--model-path", "--model", dest="model_path", default=None,
                   help=f"model directory, or an embedded model name built on demand (default {DEFAULT_MODEL}; "
                        "with --url, the server's own tokenizer path)")
    g.add_argument("--models-dir", type=Path, default=DEFAULT_MODELS_DIR,
                   help="where embedded models are built (default %(default)s)")
    g.add_argument("--device", default="auto",
                   help="server device: cpu, cuda, ... ; auto = cuda when available, else cpu (CPU runtime)")
    g.add_argument("--tp", "--tp-size", dest="tp", type=int, default=1, help="tensor parallel size")
    g.add_argument("--server-args", action="append", default=[],
                   help="extra server flags, one shell-quoted string (repeatable); they win over the arm's")
    g.add_argument("--ready-check-timeout-sec", type=float, default=600.0,
                   help="seconds to wait for a launched server's /health (default %(default)s)")
    g.add_argument("--log-dir", type=Path, default=None,
                   help="server logs and commands (default: next to --json, else ./sglang-replayssm-bench-logs)")
    g.add_argument("--paired", action="store_true",
                   help="every launched arm's server up at once, each request sent to every arm in turn (one at a "
                        "time), so host drift hits every arm alike; the table adds each arm's per-request TTFT "
                        "difference to the first arm's")

    w = p.add_argument_group("workload")
    w.add_argument("--dataset-name", choices=("generated-shared-prefix", "rag", "rag-mem", "mtp-fit"),
                   default="generated-shared-prefix",
                   help="generated-shared-prefix (SGLang's shape), rag (multi-turn, documents reused), rag-mem (rag over "
                        "many zipf-reused documents, a working set >= 2x the cache: equal memory by default) or mtp-fit "
                        "(the prompts an embedded model's MTP layer was fitted to, --gsp-output-len tokens each: "
                        "the workload for the nextn arms)")
    w.add_argument("--gsp-num-groups", type=int, default=4)
    w.add_argument("--gsp-prompts-per-group", type=int, default=6)
    w.add_argument("--gsp-system-prompt-len", type=int, default=1024)
    w.add_argument("--gsp-question-len", type=int, default=64)
    w.add_argument("--gsp-output-len", type=int, default=16)
    w.add_argument("--gsp-range-ratio", type=float, default=None,
                   help="lengths drawn uniformly from [ratio*len, len] (also for rag; default 1.0, rag-mem 0.5)")
    w.add_argument("--gsp-num-turns", type=int, default=1,
                   help="turns per prompt; a later turn appends the answer and a new question")
    w.add_argument("--gsp-ordered", action="store_true", help="send in generation order (default shuffled; also rag)")
    w.add_argument("--gsp-group-distribution", choices=("uniform", "zipf"), default=None,
                   help="prompts per group (rag: conversations per document; default uniform, rag-mem zipf 0.8)")
    w.add_argument("--gsp-zipf-alpha", type=float, default=None, help="zipf exponent, > 0")
    w.add_argument("--rag-num-docs", type=int, default=None, help="documents in the corpus (default 4, rag-mem 32)")
    w.add_argument("--rag-doc-len", type=int, default=768)
    w.add_argument("--rag-system-prompt-len", type=int, default=None,
                   help="shared by every conversation (default 256, rag-mem 200)")
    w.add_argument("--rag-num-conversations", type=int, default=None, help="(default 8, rag-mem 48)")
    w.add_argument("--rag-num-turns", type=int, default=None, help="(default 2, rag-mem 3)")
    w.add_argument("--rag-question-len", type=int, default=64)
    w.add_argument("--rag-output-len", type=int, default=16)
    w.add_argument("--request-rate", type=float, default=float("inf"),
                   help="conversation starts per second, Poisson (default inf: all at once)")
    w.add_argument("--max-concurrency", type=int, default=1,
                   help="requests in flight at most (0: no cap); 1 by default so TTFT is prefill time, not queueing")
    w.add_argument("--warmup-requests", type=int, default=1, help="short unrelated requests before measuring")
    w.add_argument("--flush-cache", action="store_true", help="POST /flush_cache after warmup")
    w.add_argument("--seed", type=int, default=1)

    m = p.add_argument_group("equal memory (launched arms baseline, upstream, plugin)")
    m.add_argument("--equal-memory-mib", type=float, default=None,
                   help="every arm gets this many MiB of cache (KV + mamba states + ring + records), split as "
                        "`sglang-replayssm plan` does and pinned by --max-mamba-cache-size / --max-total-tokens / "
                        f"SGLANG_REPLAYSSM_RECORD_TOKENS (default: off; rag-mem {RAG_MEM_MIB:g})")
    m.add_argument("--equal-memory-state-ratio", type=float, default=0.9,
                   help="state slots get ratio / (1 + ratio) of it, SGLang's --mamba-full-memory-ratio rule "
                        "(default %(default)s)")
    m.add_argument("--equal-memory-record-tokens", type=int, default=None,
                   help="the plugin arm's record tokens (default: the default_record_policy rule; 0: none)")

    o = p.add_argument_group("output")
    o.add_argument("--json", "--output-file", dest="json", type=Path, default=None,
                   help="JSON results, rewritten after every arm")
    o.add_argument("--plot-dir", type=Path, default=None, help="write ttft_cdf.png and hit_rate.png here")
    o.add_argument("--disable-tqdm", action="store_true")
    return p


def _workload(args: argparse.Namespace, vocab: list[int], model_dir: Path) -> list[Conversation]:
    if args.gsp_group_distribution == "uniform" and args.gsp_zipf_alpha is not None:
        raise BenchError("--gsp-zipf-alpha is only meaningful with --gsp-group-distribution zipf")
    if args.dataset_name == "mtp-fit":
        from sglang_replayssm.models.mtp import FIT_NEW_TOKENS

        prompts, group_size, shared_len = mtp_fit_prompts(model_dir)
        if args.gsp_output_len >= FIT_NEW_TOKENS:
            raise BenchError(f"--gsp-output-len {args.gsp_output_len}: mtp-fit continuations are fitted for "
                             f"{FIT_NEW_TOKENS} tokens; ask for fewer")
        return fitted_conversations(prompts, group_size, shared_len, args.gsp_output_len, args.gsp_ordered,
                                    args.seed)
    if args.dataset_name in ("rag", "rag-mem"):
        return generate_rag(RagSpec(
            num_docs=args.rag_num_docs, doc_len=args.rag_doc_len, system_prompt_len=args.rag_system_prompt_len,
            num_conversations=args.rag_num_conversations, num_turns=args.rag_num_turns,
            question_len=args.rag_question_len, output_len=args.rag_output_len, range_ratio=args.gsp_range_ratio,
            doc_distribution=args.gsp_group_distribution, zipf_alpha=args.gsp_zipf_alpha,
            ordered=args.gsp_ordered), vocab, args.seed)
    return generate_gsp(GspSpec(
        num_groups=args.gsp_num_groups, prompts_per_group=args.gsp_prompts_per_group,
        system_prompt_len=args.gsp_system_prompt_len, question_len=args.gsp_question_len,
        output_len=args.gsp_output_len, range_ratio=args.gsp_range_ratio, num_turns=args.gsp_num_turns,
        group_distribution=args.gsp_group_distribution, zipf_alpha=args.gsp_zipf_alpha,
        ordered=args.gsp_ordered), vocab, args.seed)


def workload_and_warmup(args: argparse.Namespace, vocab: list[int],
                        model_dir: Path) -> tuple[list[Conversation], list[Turn]]:
    """The workload's conversations and its warmup requests: at the workload's prompt length (first-time kernel and
    allocator costs at that shape), with tokens no workload prompt starts with, so nothing of them is ever a hit."""
    conversations = _workload(args, vocab, model_dir)
    first_len = max((len(c.turns[0].new_ids) for c in conversations if c.turns), default=16)
    warmup = warmup_requests(args.warmup_requests, vocab, args.seed, first_tokens(conversations), input_len=first_len)
    return conversations, warmup


def _resolve_device(device: str) -> str:
    if device != "auto":
        return device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class Bench:
    """State of one invocation: the JSON document and the arms done so far."""

    def __init__(self, args: argparse.Namespace, argv: list[str]) -> None:
        self.args = args
        self.doc: dict[str, Any] = {
            "tool": "sglang-replayssm bench",
            "version": __version__,
            "argv": argv,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "config": {k: (str(v) if isinstance(v, Path) or v == float("inf") else v)
                       for k, v in vars(args).items()},
            "arm_order": [],
            "arms": {},
            "failed_arms": {},
            "error": None,
        }
        self.records: dict[str, list[RequestRecord]] = {}
        self.conversations: list[Conversation] = []  # the workload, for the attention-only ceiling
        self.sizes: Any = None  # memory.Sizes of the served model (None: cannot price its caches)
        self.budgets: dict[str, Any] = {}  # equal memory: arm -> memory.ArmBudget

    def save(self) -> None:
        if self.args.json is not None:
            write_json(self.args.json, self.doc)

    def fail(self, message: str) -> None:
        self.doc["error"] = message
        self.save()

    def add_arm(self, name: str, run: Any, server_cmd: str | None, **extra: Any) -> None:
        self.records[name] = run.records
        ref_name = next(iter(self.records))
        agree = agreement(ref_name, self.records[ref_name], run.records)
        ceiling = ceiling_tokens(self.conversations, run.records)
        result = arm_result(run.summary, run.server, agree, server_cmd, run.records,
                            ceiling_hit_rate=ceiling_hit_rate(ceiling, run.records), notes=run.notes, **extra)
        for request in result["requests"]:
            request["ceiling_tokens"] = ceiling.get(request["rid"])
        self.doc["arms"][name] = result
        self.save()

    def add_failure(self, name: str, error: str, server_cmd: str | None, **extra: Any) -> None:
        self.doc["failed_arms"][name] = {"error": error, "server_cmd": server_cmd, **extra}
        self.save()


def _run_arms(bench: Bench, conversations: list[Conversation], warmup: list[Turn],
              model_dir: Path | None, arm_names: list[str]) -> None:
    from sglang_replayssm.bench.launch import arm_launch
    from sglang_replayssm.bench.runner import ArmRunError, run_arm
    from sglang_replayssm.bench.server import ServerProcess, ServerStartError, pick_port

    args = bench.args
    bench.conversations = conversations
    run_kw = dict(request_rate=args.request_rate, max_concurrency=args.max_concurrency or None,
                  seed=args.seed, flush_cache=args.flush_cache, disable_tqdm=args.disable_tqdm)
    if args.url is not None:
        name = arm_names[0]
        bench.doc["arm_order"].append(name)
        try:
            run = run_arm(args.url, conversations, warmup, label=name, **run_kw)
        except ArmRunError as exc:
            print(f"error: arm {name} failed: {exc}", file=sys.stderr)
            bench.add_failure(name, str(exc), None, url=args.url)
            return
        bench.add_arm(name, run, None, url=args.url)
        return

    assert model_dir is not None
    device = _resolve_device(args.device)
    if args.paired:
        from sglang_replayssm.bench.paired import run_paired_arms

        run_paired_arms(bench, conversations, warmup, model_dir, device, arm_names)
        return
    for name in arm_names:
        bench.doc["arm_order"].append(name)
        spec = arm_launch(args, name, model_dir, device, pick_port(), bench.budgets)
        t0 = time.monotonic()
        try:
            with ServerProcess(spec.cmd, spec.env, spec.log_path, spec.base_url,
                               args.ready_check_timeout_sec) as srv:
                print(f"[{name}] server healthy after {srv.startup_s:.1f} s", flush=True)
                try:
                    run = run_arm(srv.base_url, conversations, warmup, label=name, **run_kw)
                except ArmRunError as exc:
                    raise ArmRunError(f"{exc}\n{srv.diagnosis()}") from exc
                spent = spent_bytes(bench.sizes, spec.log_path, srv.base_url)
        except (ServerStartError, ArmRunError, OSError) as exc:
            first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            print(f"error: arm {name} failed: {exc}", file=sys.stderr, flush=True)
            bench.add_failure(name, str(exc), spec.cmd_str, log=str(spec.log_path), summary=first)
            continue
        bench.add_arm(name, run, spec.cmd_str, log=str(spec.log_path), arm_wall_s=time.monotonic() - t0,
                      startup_s=srv.startup_s, cache_bytes=spent,
                      equal_memory=spec.budget.as_dict() if spec.budget else None)


def _prepare(args: argparse.Namespace) -> tuple[list[str], Path | None, list[int], Path]:
    """Arms, model dir (None for a remote --url model), token ids and the local model (tokenizer)
    directory; BenchError on bad input."""
    from sglang_replayssm.bench.runner import reachable, server_model_path

    if args.paired and (args.url is not None or args.max_concurrency != 1 or args.request_rate != float("inf")):
        raise BenchError("--paired sends one request at a time to launched arms: not with --url, --request-rate or "
                         "--max-concurrency other than 1")
    if args.url is not None:
        names = [x.strip() for x in (args.arms or URL_ARM).split(",") if x.strip()]
        if len(names) != 1:
            raise BenchError("with --url, --arms names one label for that server")
        ok, reason = reachable(args.url, timeout_s=10.0)
        if not ok:
            raise BenchError(f"cannot reach an SGLang server at {args.url}: {reason}")
        model = args.model_path or server_model_path(args.url)
        if model is None or not Path(model).expanduser().is_dir():
            raise BenchError(f"the tokenizer of the server at {args.url} is not a local directory "
                             f"({model!r}); pass --model-path")
        model_dir = Path(model).expanduser()
    else:
        try:
            names = parse_arms(args.arms or ",".join(DEFAULT_ARMS))
        except ValueError as exc:
            raise BenchError(str(exc)) from exc
        model_dir = resolve_model_path(args.model_path or DEFAULT_MODEL, args.models_dir)
    require_linear_attention(model_dir)
    return names, (None if args.url is not None else model_dir), vocab_ids(model_dir), model_dir


def main(argv: list[str]) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    resolve_defaults(args)
    bench = Bench(args, list(argv))
    try:
        names, model_dir, vocab, local_model = _prepare(args)
        conversations, warmup = workload_and_warmup(args, vocab, local_model)
        bench.conversations = conversations
        if model_dir is not None:
            bench.sizes, bench.budgets, doc, text = equal_memory(args, names, model_dir.name, conversations)
            if doc is not None:
                bench.doc["equal_memory"] = doc
                print(text, flush=True)
    except (BenchError, ModelError, WorkloadError, EqualMemoryError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        bench.fail(str(exc))
        return 2
    bench.doc["model_path"] = str(model_dir) if model_dir is not None else args.model_path
    bench.doc["workload"] = {"dataset_name": args.dataset_name, **describe(conversations)}
    print(f"workload: {bench.doc['workload']}", flush=True)
    bench.save()
    t0 = time.monotonic()
    try:
        _run_arms(bench, conversations, warmup, model_dir, names)
    except KeyboardInterrupt:
        bench.fail("interrupted")
        print("interrupted; arms that finished are in the JSON", file=sys.stderr)
        return 130
    bench.doc["wall_s"] = time.monotonic() - t0
    bench.save()
    print()
    print(format_table(bench.doc["arms"], bench.doc["failed_arms"]))
    found = bounds(bench.doc["arms"])
    if found:
        bench.doc["ttft_bound"] = found
        bench.save()
        print("\nTTFT the hits allow (baseline's TTFT fitted per request as fixed + per prefilled token, evaluated at "
              "each arm's prefilled tokens):\n" + format_bounds(found))
    spent_table = format_spent(bench.doc["arms"])
    if spent_table:
        print("\ncache bytes each server allocated (startup log counts x the model's unit bytes; records: "
              "/metrics)\n" + spent_table)
    if args.plot_dir is not None and bench.doc["arms"]:
        from sglang_replayssm.bench.plots import write_plots

        for path in write_plots(bench.doc["arms"], args.plot_dir):
            print(f"plot: {path}")
    if args.json is not None:
        print(f"json: {args.json}")
    partial = [n for n, a in bench.doc["arms"].items() if a.get("requests_failed")]
    for name in partial:
        arm = bench.doc["arms"][name]
        where = f"; server log {arm['log']}" if arm.get("log") else ""
        print(f"error: arm {name}: {arm['requests_failed']} request(s) failed (see their 'error' in the JSON)"
              f"{where}", file=sys.stderr)
    return 1 if bench.doc["failed_arms"] or partial else 0
