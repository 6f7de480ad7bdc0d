"""GPU timing of the record rebuild (issue 12): SGLang's prefill kernels over B spans of n records.

One rebuild batch is what :func:`sglang_replayssm.radix.records.rebuild._fold_gdn_layer` runs for one
layer: gather the records (``x`` pre-conv ``mixed_qkv`` row, ``a``, ``b``) of every span from the
record pool, SGLang's ``causal_conv1d_fn`` with each destination slot's conv window as the initial
window, the gates, and the extend kernel with ``initial_state_indices`` (the state after the span
left in place in the slot), all spans as one varlen set. :meth:`RebuildProblem.fold` mirrors that
call sequence line for line with the kernels of :mod:`.sglang_prefill_kernels`; KDA runs the same
sequence with Kimi-Linear's extend (``chunk_kda``, gate activation and beta fused in, the conv pool
in KDA's ``[slots, W-1, dim]`` layout), which is what a KDA record rebuild would call.

Per (model, n), B sequences of n records each:

* ``graph_us``: the fold alone on device (CUDA-graph replay, median; rotating over ``sets`` disjoint
  slot / record sets so that nothing is re-read from L2);
* ``copy_us``: the exact copy of the ancestor's state and conv window into the destination slots
  (``copy_mamba_state``: an index copy), which a rebuild from a state (not the root) does first;
* ``eager_us``: the fold launched eagerly back to back (index tensors reused: FLA's chunk-index
  cache hits), i.e. the launch-bound time where the host is slower than the device;
* ``serving_us``: one fold as a server runs it, host wall clock to completion: fresh index tensors
  from host lists (FLA's ``prepare_chunk_indices`` then syncs), eager launches;
* ``floor_us``: records read + state read + state write + conv window read + write, at the measured
  device-copy bandwidth; ``kernels_us`` (a few n): device time per kernel from the profiler.

Correctness (``check``, a few n): every destination state against the fp64 oracle
(:func:`sglang_replayssm.kernels.naive.recurrence_fp64` over an fp64 conv of the same records, the
conv output rounded to bf16 as SGLang's conv stores it), the conv windows bit-equal to the span's
last ``W-1`` inputs. Needs CUDA.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from sglang_replayssm.kernels.naive import compute_beta_fp64, compute_gate_fp64, recurrence_fp64
from tests.support.kernel_bench import floors, log, time_us
from tests.support.sglang_prefill_kernels import PrefillKernels, load_prefill_kernels

__all__ = ["MODELS", "RebuildProblem", "default_counts", "floor_bytes", "main", "record_bytes"]

#: Qwen3-Next GDN shard and Kimi-Linear KDA shard shapes; W is the conv kernel width.
MODELS: dict[str, dict[str, Any]] = {
    "gdn": {"H": 16, "HV": 32, "K": 128, "V": 128, "W": 4, "is_kda": False},
    "kda": {"H": 32, "HV": 32, "K": 128, "V": 128, "W": 4, "is_kda": True},
}


def default_counts(max_n: int = 255) -> list[int]:
    """1..16, then every 8th, and ``max_n``."""
    return sorted({*range(1, min(16, max_n) + 1), *range(24, max_n + 1, 8), max_n})


def conv_dim(p: dict[str, Any]) -> int:
    return 2 * p["H"] * p["K"] + p["HV"] * p["V"]


def record_bytes(p: dict[str, Any]) -> int:
    """One token's record in bf16: ``x`` (the pre-conv row), ``a`` (GDN ``[HV]``, KDA ``[HV*K]``), ``b`` ``[HV]``."""
    a = p["HV"] * (p["K"] if p["is_kda"] else 1)
    return 2 * (conv_dim(p) + a + p["HV"])


def floor_bytes(p: dict[str, Any], B: int, n: int) -> int:
    """Least HBM traffic of a rebuild batch: records read once, the fp32 state read and written once,
    the bf16 conv window read and written once (weights and gate parameters are negligible)."""
    state = 4 * p["HV"] * p["V"] * p["K"]
    window = 2 * conv_dim(p) * (p["W"] - 1)
    return B * (n * record_bytes(p) + 2 * state + 2 * window)


class RebuildProblem:
    """Record pool, conv / state pools and layer weights for B spans of up to ``n_max`` records."""

    def __init__(self, kern: PrefillKernels, model: str, B: int, n_max: int, sets: int = 3, seed: int = 0,
                 device: str = "cuda", shape: dict[str, Any] | None = None) -> None:
        p = dict(MODELS[model], **(shape or {}))
        self.kern, self.model, self.p, self.B, self.sets = kern, model, p, B, sets
        self.is_kda = bool(p["is_kda"])
        HV, K, V, W = p["HV"], p["K"], p["V"], p["W"]
        D = conv_dim(p)
        self.D = D
        dev = torch.device(device)
        g = torch.Generator(device=dev).manual_seed(seed)
        bf = torch.bfloat16
        P = sets * B * n_max + 1
        self.x_pool = torch.randn(P, D, device=dev, generator=g).to(bf)
        a_w = HV * K if self.is_kda else HV
        self.a_pool = (0.5 * torch.randn(P, a_w, device=dev, generator=g)).to(bf)
        self.b_pool = torch.randn(P, HV, device=dev, generator=g).to(bf)
        S = 2 * sets * B  # destination slots [0, sets*B), ancestor (source) slots after them
        # Qwen3-Next: bf16 conv weights, no bias; Kimi-Linear: fp32 conv weights, no bias.
        self.conv_w = (0.3 * torch.randn(D, W, device=dev, generator=g)).to(torch.float32 if self.is_kda else bf)
        self.bias = None
        # gates with realistic decays (~0.9-0.9999 per token)
        self.A_log = torch.log(0.02 + 0.2 * torch.rand(HV, device=dev, generator=g))
        if self.is_kda:
            self.dt_bias = -2.0 + 0.5 * torch.randn(HV * K, device=dev, generator=g)
            self.A_log_kda = self.A_log.view(1, 1, HV, 1)
        else:
            self.dt_bias = -2.0 + 0.5 * torch.randn(HV, device=dev, generator=g)
        self.ssm = (0.3 * torch.randn(S, HV, V, K, device=dev, generator=g)).contiguous()
        if self.is_kda:  # KDA's pool layout [slots, W-1, dim]; the backend passes its transpose
            self.conv_pool = torch.randn(S, W - 1, D, device=dev, generator=g).to(bf)
        else:
            self.conv_pool = torch.randn(S, D, W - 1, device=dev, generator=g).to(bf)
        self.perm = torch.randperm(P - 1, device=dev, generator=g)  # records scattered in the pool
        self.n = 0

    # ------------------------------------------------------------------ problem at one n

    def prepare(self, n: int) -> None:
        """Index tensors of each set for spans of ``n`` records (as :func:`record_rebuild.rebuild` builds them)."""
        B, dev = self.B, self.x_pool.device
        self.n = n
        self.lens = [n] * B
        self.cu = torch.arange(0, B * n + 1, n, dtype=torch.int32, device=dev)
        self.has_state = torch.ones(B, dtype=torch.bool, device=dev)
        self.slots = [self.perm[s * B * n : (s + 1) * B * n].clone() for s in range(self.sets)]
        self.dst = [torch.arange(s * B, (s + 1) * B, dtype=torch.int32, device=dev) for s in range(self.sets)]
        self.src = [d + self.sets * B for d in self.dst]

    def conv_states(self) -> torch.Tensor:
        return self.conv_pool.transpose(-1, -2) if self.is_kda else self.conv_pool

    def copy(self, s: int) -> None:
        """The exact copy of the ancestor slots into the destination slots (``copy_mamba_state``)."""
        src, dst = self.src[s].long(), self.dst[s].long()
        self.ssm[dst] = self.ssm[src]
        self.conv_pool[dst] = self.conv_pool[src]

    def fold(self, s: int, *, slots: torch.Tensor | None = None, cu: torch.Tensor | None = None,
             dst: torch.Tensor | None = None, has_state: torch.Tensor | None = None,
             lens: list[int] | None = None, sequential: bool = False) -> torch.Tensor:
        """One layer's rebuild of set ``s``: the call sequence of ``record_rebuild._fold_gdn_layer``
        (``sequential``: its short-span path, the decode kernel over the spans)."""
        slots = self.slots[s] if slots is None else slots
        cu = self.cu if cu is None else cu
        idx = self.dst[s] if dst is None else dst
        has_state = self.has_state if has_state is None else has_state
        lens = self.lens if lens is None else lens
        p, kern = self.p, self.kern
        x, a, b = self.x_pool[slots], self.a_pool[slots], self.b_pool[slots]
        total = x.shape[0]
        mixed = kern.causal_conv1d_fn(
            x.transpose(0, 1), self.conv_w, self.bias, activation="silu", conv_states=self.conv_states(),
            has_initial_state=has_state, cache_indices=idx, query_start_loc=cu, seq_lens_cpu=lens,
        ).transpose(0, 1)[:total]  # fmt: skip
        H, HV, K, V = p["H"], p["HV"], p["K"], p["V"]
        q, k, v = torch.split(mixed, [H * K, H * K, HV * V], dim=-1)
        q = q.reshape(1, total, H, K)
        k = k.reshape(1, total, H, K)
        v = v.reshape(1, total, HV, V)
        if sequential:
            a_in = a.unsqueeze(0).unflatten(-1, (-1, K)) if self.is_kda else a
            return kern.fused_sigmoid_gating_delta_rule_update(
                A_log=self.A_log, dt_bias=self.dt_bias, q=q, k=k, v=v, a=a_in, b=b, initial_state_source=self.ssm,
                initial_state_indices=idx, cu_seqlens=cu, use_qk_l2norm_in_kernel=True, softplus_beta=1.0,
                softplus_threshold=20.0, is_kda=self.is_kda,
            )  # fmt: skip
        if self.is_kda:
            out = kern.chunk_kda(
                q=q, k=k, v=v, g=a.unsqueeze(0).unflatten(-1, (-1, K)), beta=b.unsqueeze(0),
                initial_state=self.ssm, initial_state_indices=idx, use_qk_l2norm_in_kernel=True,
                cu_seqlens=cu, A_log=self.A_log_kda, dt_bias=self.dt_bias, lower_bound=None, beta_is_raw=True,
            )  # fmt: skip
        else:
            g, beta = kern.fused_gdn_gating(self.A_log, a, b, self.dt_bias)
            out = kern.chunk_gated_delta_rule(
                q=q, k=k, v=v, g=g, beta=beta, initial_state=self.ssm, initial_state_indices=idx,
                cu_seqlens=cu, head_first=False, use_qk_l2norm_in_kernel=True,
            )  # fmt: skip
        return out[0] if isinstance(out, tuple) else out

    def fold_fresh(self, s: int) -> None:
        """As a server runs it: index tensors built from host lists first (``record_rebuild.rebuild``)."""
        dev = self.x_pool.device
        lens = [self.n] * self.B
        slots = torch.tensor(self.slots[s].tolist(), dtype=torch.int64).to(dev)
        cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=dev)
        dst = torch.tensor(self.dst[s].tolist(), dtype=torch.int32).to(dev)
        has_state = torch.tensor([True] * self.B, dtype=torch.bool, device=dev)
        self.fold(s, slots=slots, cu=cu, dst=dst, has_state=has_state, lens=lens)

    def fold_fresh_rotating(self) -> None:
        self._calls = getattr(self, "_calls", -1) + 1
        self.fold_fresh(self._calls % self.sets)

    # ------------------------------------------------------------------ oracle

    def oracle(self, s: int, state0: torch.Tensor, window0: torch.Tensor,
               round_beta: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
        """fp64 state after each span and the conv window after it, from the given slot contents.

        ``state0`` ``[B, HV, V, K]``, ``window0`` ``[B, dim, W-1]`` (oldest first). The conv output is
        rounded to bf16 (SGLang's conv stores its input dtype); everything after it is float64, but for
        GDN's beta, which the prefill gating kernel rounds to bf16 (``round_beta``; the decode kernel
        keeps it in fp32)."""
        p, B, n = self.p, self.B, self.n
        H, HV, K, V, W = p["H"], p["HV"], p["K"], p["V"], p["W"]
        f64 = torch.float64
        x = self.x_pool[self.slots[s]].view(B, n, self.D)
        xp = torch.cat([window0.transpose(1, 2).to(f64), x.to(f64)], dim=1)  # [B, W-1+n, D]
        w = self.conv_w.to(f64)
        conv = xp[:, :n] * w[:, 0]
        for j in range(1, W):
            conv = conv + xp[:, j : j + n] * w[:, j]
        conv = F.silu(conv).to(torch.bfloat16).to(f64)
        q = conv[..., : H * K].reshape(B, n, H, K)
        k = conv[..., H * K : 2 * H * K].reshape(B, n, H, K)
        v = conv[..., 2 * H * K :].reshape(B, n, HV, V)
        a = self.a_pool[self.slots[s]].view(B, n, -1)
        b = self.b_pool[self.slots[s]].view(B, n, HV)
        if self.is_kda:
            g = compute_gate_fp64(a.view(B, n, HV, K), self.A_log, self.dt_bias.view(HV, K), is_kda=True)
            beta = compute_beta_fp64(b, round_to_input_dtype=False)
        else:
            g = compute_gate_fp64(a, self.A_log, self.dt_bias, is_kda=False)
            beta = compute_beta_fp64(b, round_to_input_dtype=round_beta)
        tr = lambda t: t.transpose(0, 1)  # noqa: E731 - [B, n, ...] -> [n, B, ...]
        _, final = recurrence_fp64(state0, tr(q), tr(k), tr(v), tr(g), tr(beta))[:2]
        return final, xp[:, -(W - 1) :].transpose(1, 2)

    def check(self, s: int = 0, sequential: bool = False) -> dict[str, float | bool]:
        """Run set ``s`` once from its current slots (after the ancestor copy) against the oracle."""
        self.copy(s)
        dst = self.dst[s].long()
        state0 = self.ssm[dst].clone()
        window0 = self.conv_states()[dst].clone()
        self.fold(s, sequential=sequential)
        if self.ssm.is_cuda:
            torch.cuda.synchronize()
        want, want_win = self.oracle(s, state0, window0, round_beta=not sequential)
        got = self.ssm[dst].to(torch.float64)
        err = (got - want).flatten(1).norm(dim=1) / want.flatten(1).norm(dim=1)
        win = self.conv_states()[dst].to(torch.float64)
        return {
            "state_rel": float((got - want).norm() / want.norm()),
            "state_rel_worst_seq": float(err.max()),
            "finite": bool(torch.isfinite(got).all()),
            "window_equal": bool(torch.equal(win, want_win)),
            # what the span changed, for scale: a kernel that did nothing would be this far off
            "state_change_rel": float((want - state0.to(torch.float64)).norm() / want.norm()),
        }


def _profile(pb: RebuildProblem, reps: int = 3) -> dict[str, float]:
    """Device microseconds per kernel name, averaged over ``reps`` eager folds."""
    from torch.profiler import ProfilerActivity, profile

    pb.fold(0)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for r in range(reps):
            pb.fold(r % pb.sets)
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = getattr(ev, "cuda_time_total", 0.0)
        if t:
            out[ev.key[:80]] = round(float(t) / reps, 2)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]))


def _host_us(fn: Callable[[], object], reps: int = 15) -> float:
    """Median host wall clock of ``fn`` to device completion."""
    torch.cuda.synchronize()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        ts.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(ts)


def bench_model(kern: PrefillKernels, model: str, B: int, counts: list[int], check_at: set[int],
                profile_at: set[int], TBps: float, rows: list[dict] | None = None,
                save: Callable[[], None] | None = None, sequential_max: int = 0) -> list[dict]:
    """One row per record count; spans of at most ``sequential_max`` records also time and check the
    sequential (decode-kernel) fold: ``seq_*`` columns."""
    pb = RebuildProblem(kern, model, B, max(counts))
    rows = [] if rows is None else rows
    for n in counts:
        pb.prepare(n)
        row: dict[str, Any] = {"model": model, "B": B, "n": n}
        try:
            if n in check_at:
                row["check"] = pb.check(0)

            def folds() -> None:
                for s in range(pb.sets):
                    pb.fold(s)

            def copies() -> None:
                for s in range(pb.sets):
                    pb.copy(s)

            t, meth = time_us(folds)
            row["graph_us"], row["graph_method"] = t / pb.sets, meth
            row["copy_us"] = time_us(copies)[0] / pb.sets
            row["eager_us"] = time_us(folds, graph=False)[0] / pb.sets
            row["serving_us"] = _host_us(pb.fold_fresh_rotating)
            if n in profile_at:
                row["kernels_us"] = _profile(pb)
            if n <= sequential_max:
                if n in check_at:
                    row["seq_check"] = pb.check(0, sequential=True)

                def seq_folds() -> None:
                    for s in range(pb.sets):
                        pb.fold(s, sequential=True)

                row["seq_graph_us"] = time_us(seq_folds)[0] / pb.sets
                row["seq_eager_us"] = time_us(seq_folds, graph=False)[0] / pb.sets
        except Exception as e:  # keep the sweep going; the row says what failed
            row["error"] = f"{type(e).__name__}: {str(e)[:400]}"
        nb = floor_bytes(pb.p, B, n)
        row["floor_bytes"] = nb
        row["floor_us"] = nb / (TBps * 1e6)
        if "graph_us" in row:
            row["graph_x_floor"] = row["graph_us"] / row["floor_us"]
            row["rebuild_us"] = row["graph_us"] + row["copy_us"]
        if "seq_graph_us" in row:
            row["seq_x_floor"] = row["seq_graph_us"] / row["floor_us"]
        log(json.dumps({k: v for k, v in row.items() if k != "kernels_us"}, default=str))
        rows.append(row)
        if save is not None:
            save()
    return rows


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--sglang-root", type=Path, default=None, help="folder holding SGLang's kernel files")
    ap.add_argument("--models", nargs="+", default=["gdn", "kda"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--counts", type=int, nargs="+", default=None, help="record counts n (default 1..16, every 8th, 255)")
    ap.add_argument("--check-at", type=int, nargs="+", default=[1, 3, 4, 63, 64, 65, 128, 255])
    ap.add_argument("--profile-at", type=int, nargs="+", default=[1, 16, 64, 128, 255])
    ap.add_argument("--sequential-max", type=int, default=64,
                    help="also time / check the sequential (decode-kernel) fold for n up to this")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    kern = load_prefill_kernels(args.sglang_root)
    counts = args.counts or default_counts()
    fl = floors(1 << 30)
    res: dict[str, Any] = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                           "kernels_from": kern.source, "B": args.batch, "copy": fl, "rows": []}  # fmt: skip
    log(json.dumps({k: v for k, v in res.items() if k != "rows"}, default=str))
    json_path = args.json

    def save() -> None:
        if json_path is not None:
            json_path.write_text(json.dumps(res, indent=1, default=str))

    for model in args.models:
        bench_model(kern, model, args.batch, counts, set(args.check_at), set(args.profile_at), fl["copy_TBps"],
                    res["rows"], save, sequential_max=args.sequential_max)  # fmt: skip
    log(f"{'model':5} {'n':>4} {'graph us':>9} {'floor us':>9} {'x floor':>8} {'copy us':>8} {'eager us':>9} "
        f"{'serving us':>11} {'state rel':>10} {'seq us':>8} {'seq eager':>9} {'seq rel':>9}")  # fmt: skip
    for r in res["rows"]:
        chk = r.get("check", {})
        log(f"{r['model']:5} {r['n']:>4} {r.get('graph_us', float('nan')):>9.1f} {r['floor_us']:>9.1f} "
            f"{r.get('graph_x_floor', float('nan')):>8.2f} {r.get('copy_us', float('nan')):>8.1f} "
            f"{r.get('eager_us', float('nan')):>9.1f} {r.get('serving_us', float('nan')):>11.1f} "
            f"{chk.get('state_rel', float('nan')):>10.2e} {r.get('seq_graph_us', float('nan')):>8.1f} "
            f"{r.get('seq_eager_us', float('nan')):>9.1f} "
            f"{r.get('seq_check', {}).get('state_rel', float('nan')):>9.2e}")  # fmt: skip


if __name__ == "__main__":
    main()
