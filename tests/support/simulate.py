"""A CPU simulation of the scheduler / model-runner steps that move ReplaySSM mamba state (for tests).

Everything that owns or moves mamba state is SGLang 0.5.23's real code on CPU tensors: the
``UnifiedRadixCache`` + ``MambaComponent`` (python tree core), ``HybridReqToTokenPool`` /
``MambaPool`` with the decode ring, built by SGLang's own unit-test kit
(``sglang.test.kits.unified_radix_cache.fixtures.build_fixture``); the admission match
(``Req.init_next_round_input``), slot allocation (``alloc_req_slots``), the deferred copy-on-write
(``ScheduleBatch._collect_deferred_mamba_cow_and_clear`` + ``ModelRunner.
_maybe_execute_deferred_mamba_cow_and_clear``), the prefill track plan
(``ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend``), the lazy ping-pong prealloc, the
decode cursor advance and force-flush mask (``MambaAttnBackendBase._forward_metadata``), the decode
track snapshot (``_track_mamba_state_decode``, SGLang's Triton copy kernel, interpreted on CPU), the
post-decode track bookkeeping (``BatchResultProcessor._mamba_prefix_cache_update``), checkpoints
(``checkpoint_kv_cache``), finish (``release_kv_cache``) and eviction.

Only the model is replaced (:class:`simulate_model.ToyModel`, whose token paths have an fp64
oracle state). Extend ("prefill") is that recurrence on the slot's ``temporal`` (like SGLang's
extend kernels it reads the checkpoint and ignores the ring); decode is
:func:`sglang_replayssm.kernels.ring_decode_ref.ring_decode_torch` (a drop-in for SGLang's ReplaySSM
decode kernel) on the pool tensors.

:meth:`Sim.check` (:mod:`simulate_checks`) states the invariants the adapter must keep: every
radix node's ``(conv, temporal)`` is its token path's state and its ring is empty; every running
request's checkpoint + ring reproduces its state.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterable, Sequence
from types import SimpleNamespace
from typing import Any

import torch

from tests.support import simulate_records
from tests.support.simulate_checks import SimInvariants
from tests.support.simulate_fixture import (
    backend_cls,
    build_fixture,
    result_processor_cls,
    torch_track_copy,
)
from tests.support.simulate_model import SimConfig, SimReq, ToyModel, rel_err, track_grid_of

__all__ = ["Sim", "SimConfig", "SimReq", "ToyModel", "build_fixture", "rel_err", "track_grid_of"]


class Sim(SimInvariants):
    """One simulated server: SGLang's cache objects driven through request lifecycles."""

    def __init__(self, cfg: SimConfig):
        from sglang.srt.runtime_context import mamba_track_grid

        self.cfg = cfg
        self.model = ToyModel(cfg)
        self.cache, self.allocator, self.req_pool = build_fixture(cfg, self.model)
        self.mamba_pool = self.req_pool.mamba_pool
        self.backend = backend_cls()(self.req_pool)
        self.results = result_processor_cls()(self.cache)
        self.track_grid = mamba_track_grid(self.cache.page_size)
        self.running: list[SimReq] = []
        self._rid = 0
        if cfg.records:
            simulate_records.attach(self)

    # -- requests -----------------------------------------------------------------------------------

    def _new_req(self, prompt: Sequence[int], max_new_tokens: int) -> Any:
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        sp = SamplingParams(temperature=0, max_new_tokens=max_new_tokens)
        req = Req(
            rid=f"sim-{self._rid}",
            origin_input_text="",
            origin_input_ids=array("q", prompt),
            sampling_params=sp,
        )
        self._rid += 1
        return req

    def _evict_kv(self, n: int) -> None:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        if self.allocator.available_size() < n:
            self.cache.evict(EvictParams(num_tokens=n - self.allocator.available_size()))
        if self.allocator.available_size() < n:
            raise RuntimeError(f"simulation out of KV slots ({self.allocator.available_size()} < {n})")

    def admit(self, prompt: Sequence[int], script: Sequence[int]) -> SimReq:
        """Match, allocate, prefill and checkpoint a new request; it then decodes ``script[1:]``.

        ``script[0]`` is the token sampled at the end of prefill. A one-token script finishes at
        prefill (and donates its state there).
        """
        if not prompt or not script:
            raise ValueError("prompt and script must be non-empty")
        req = self._new_req(prompt, len(script))
        return self._start(req, SimReq(req, list(script)))

    def _start(self, req: Any, sreq: SimReq) -> SimReq:
        """Admission of ``req`` (new, or retracted and recomputed): match, allocate, prefill its
        fill ids, sample ``script[len(output_ids)]``, checkpoint or finish."""
        from sglang.srt.mem_cache.allocation import alloc_req_slots

        req.init_next_round_input(self.cache)  # real admission match (+ deferred COW source)
        if req.needs_host_load_back():
            self._load_back(req)
        req.extend_end = len(req.full_untruncated_fill_ids)
        req.lock = self.cache.lock(req.last_node)
        alloc_req_slots(self.req_pool, [req], self.cache)
        prefix = self.cache.prefix_device_indices(req) if req.prefix_len > 0 else None
        n_new = req.extend_end - req.prefix_len
        self._evict_kv(n_new)
        new = self.allocator.alloc(n_new)
        if self.cfg.records:
            simulate_records.assign(self, new)
            simulate_records.assign_states(self, new, req.prefix_len)
        row = req.kv.req_pool_idx
        if prefix is not None:
            self.req_pool.write((row, slice(0, req.prefix_len)), prefix)
        self.req_pool.write((row, slice(req.prefix_len, req.extend_end)), new)
        req.kv.kv_committed_len = req.kv.kv_allocated_len = req.extend_end
        sreq.matched = req.prefix_len
        self._prefill(sreq)
        req.output_ids.append(sreq.script[len(req.output_ids)])
        if len(req.output_ids) >= len(sreq.script):
            self._finish(sreq)
        else:
            from sglang.srt.mem_cache.common import checkpoint_kv_cache

            checkpoint_kv_cache(req, self.cache)
            self.running.append(sreq)
        return sreq

    def _load_back(self, req: Any) -> None:
        """HiCache host hit: what ``PrefillAdder`` does (``init_load_back``: the node's path and,
        for mamba, the request slot loaded from host), then the host->device copies completed
        before the forward (the model runner waits for them layer by layer)."""
        from sglang.srt.mem_cache.base_prefix_cache import InitLoadBackParams

        loaded = self.cache.init_load_back(
            InitLoadBackParams(best_match_node=req.best_match_node, host_hit_length=req.host_hit_length, req=req)
        )
        req.host_loaded_length, req.last_node = loaded
        if req.host_loaded_length:
            req.prefix_len += req.host_loaded_length
            req.kv.cache_protected_len = req.prefix_len
        if self.cache.ready_to_load_host_cache() != -1:
            for ack in list(self.cache.cache_controller.ack_load_queue):
                ack.finish_event.synchronize()
            self.cache.loading_check()

    def _prefill(self, sreq: SimReq) -> None:
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner

        req = sreq.req
        if self.cfg.records:  # ModelRunner.forward starts with the rebuilds the match queued
            simulate_records.run_pending(self)
            new = self.req_pool.req_to_token[req.kv.req_pool_idx, req.prefix_len:req.extend_end]
            simulate_records.capture(self, new, req.full_untruncated_fill_ids[req.prefix_len:req.extend_end])
        # Deferred COW / clear, exactly as the scheduler collects and the model runner runs them.
        batch = SimpleNamespace()
        ScheduleBatch._collect_deferred_mamba_cow_and_clear(batch, [req])
        fb = SimpleNamespace(
            forward_mode=ForwardMode.EXTEND,
            mamba_clear_indices=batch.mamba_clear_indices,
            mamba_cow_src_indices=batch.mamba_cow_src_indices,
            mamba_cow_dst_indices=batch.mamba_cow_dst_indices,
        )
        runner = SimpleNamespace(req_to_token_pool=self.req_pool, is_draft_worker=False)
        ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(runner, fb)
        track = None
        if self.cfg.extra_buffer:
            stub = SimpleNamespace(
                model_config=SimpleNamespace(hf_text_config=SimpleNamespace(mamba_chunk_size=self.cfg.chunk)),
                tree_cache=self.cache,
                req_to_token_pool=self.req_pool,
            )
            entry = ScheduleBatch._mamba_radix_cache_v2_req_prepare_for_extend(stub, req)
            if entry.track_mask:
                track = (
                    req.kv.mamba_ping_pong_track_buffer[entry.track_position],
                    req.kv.mamba_last_track_seqlen,
                )
        # The extend "kernel": recurrence from the slot's checkpoint (the ring is ignored, as by
        # SGLang's extend kernels), writing the final state and, when planned, the track state.
        slot = int(req.kv.mamba_pool_idx)
        tokens = list(req.full_untruncated_fill_ids[: req.extend_end])
        keep = simulate_records.kept_depths(self, req.prefix_len, req.extend_end - req.prefix_len) \
            if self.cfg.records else []
        kept = self._run_extend(slot, tokens, req.prefix_len, track, keep)
        if keep:
            new = self.req_pool.req_to_token[req.kv.req_pool_idx, req.prefix_len:req.extend_end]
            simulate_records.capture_states(self, new, req.prefix_len, kept)

    def _run_extend(self, slot: int, tokens: list[int], start: int, track: tuple[Any, int] | None,
                    keep: Sequence[int] = ()) -> list[list[torch.Tensor]]:
        """The extend "kernel" over ``tokens[start:]``; returns the states after each depth of ``keep``."""
        m = self.model
        states = [self.temporal[li, slot].to(torch.float64) for li in range(self.cfg.mamba_layers)]
        windows = [self.conv[li, slot].clone() for li in range(self.cfg.mamba_layers)]
        kept = []
        for pos in range(start, len(tokens)):
            states = m._step(states, tokens[pos])
            if pos + 1 in keep:
                kept.append(states)
            windows = [m.extend_conv(w, li, [tokens[pos]]) for li, w in enumerate(windows)]
            if track is not None and pos + 1 == track[1]:
                dst = int(track[0])
                for li in range(self.cfg.mamba_layers):
                    self.temporal[li, dst] = states[li].to(self.temporal.dtype)
                    self.conv[li, dst] = windows[li]
        for li in range(self.cfg.mamba_layers):
            self.temporal[li, slot] = states[li].to(self.temporal.dtype)
            self.conv[li, slot] = windows[li]
        return kept

    def decode_until_pending(self, sreq: SimReq, min_steps: int = 1, max_steps: int = 40) -> int:
        """Decode ``sreq`` alone until its ring holds records (after at least ``min_steps`` steps);
        return its cursor."""
        slot = int(sreq.req.kv.mamba_pool_idx)
        for step in range(max_steps):
            self.decode([sreq])
            if step + 1 >= min_steps and int(self.write_pos[slot]) > 0:
                return int(self.write_pos[slot])
        raise AssertionError("the ring never held pending records")

    def decode(self, reqs: Iterable[SimReq] | None = None) -> None:
        """One decode step of ``reqs`` (default: every running request) as one batch."""
        from sglang.srt.managers.schedule_batch import ScheduleBatch, set_mamba_track_indices_from_reqs
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from sglang_replayssm.kernels.read_copy_ref import read_copy_decode_torch
        from sglang_replayssm.kernels.ring_decode_ref import ring_decode_torch
        from sglang_replayssm.radix.read_copy.store import decode_step, read_copy_of

        batch_reqs = list(self.running if reqs is None else reqs)
        if not batch_reqs:
            return
        self._evict_kv(len(batch_reqs))
        if self.cfg.records:  # ModelRunner.forward starts with what is queued (HiCache record loads)
            simulate_records.run_pending(self)
        for sreq in batch_reqs:  # prepare_for_decode: one more KV slot, the fed token committed
            req = sreq.req
            loc = self.allocator.alloc(1)
            if self.cfg.records:
                simulate_records.assign(self, loc)
                simulate_records.capture(self, loc, [req.output_ids[-1]])
            pos = req.kv.kv_committed_len
            self.req_pool.write((req.kv.req_pool_idx, slice(pos, pos + 1)), loc)
            req.kv.kv_committed_len += 1
            req.kv.kv_allocated_len += 1
            req.decode_batch_idx += 1
        reqs_ = [s.req for s in batch_reqs]
        seq_lens = torch.tensor([r.kv.kv_committed_len for r in reqs_], dtype=torch.int64)
        batch = SimpleNamespace(
            reqs=reqs_,
            req_to_token_pool=self.req_pool,
            seq_lens_cpu=seq_lens,
            req_pool_indices=torch.tensor([r.kv.req_pool_idx for r in reqs_], dtype=torch.int64),
            spec_algorithm=SimpleNamespace(is_none=lambda: True),
            mamba_track_indices=None,
            mamba_track_mask=None,
            mamba_track_buffer_indices=None,
            mamba_track_mask_cpu=None,
        )
        if self.cfg.extra_buffer:
            if self.cfg.lazy:
                ScheduleBatch.mamba_lazy_prealloc_at_boundary(batch, self.track_grid)
            set_mamba_track_indices_from_reqs(batch)
            mask = seq_lens % self.track_grid == 0
            batch.mamba_track_mask_cpu = mask.tolist()
            batch.mamba_track_mask = mask
            batch.mamba_decode_batch_idx_cpu = [r.decode_batch_idx for r in reqs_]
        fb = SimpleNamespace(
            batch_size=len(reqs_),
            forward_mode=ForwardMode.DECODE,
            logical_forward_mode=ForwardMode.DECODE,
            req_pool_indices=batch.req_pool_indices,
            seq_lens_cpu=seq_lens,
            mamba_track_indices=batch.mamba_track_indices,
            mamba_track_mask=batch.mamba_track_mask,
            mamba_prefill_track_mask_cpu=None,
            mamba_track_seqlens_cpu=None,
            extend_seq_lens_cpu=None,
        )
        backend = self.backend
        backend.forward_metadata = backend._forward_metadata(fb)
        md = backend.forward_metadata
        fed = torch.tensor([r.output_ids[-1] for r in reqs_], dtype=torch.long)
        cache = self.mamba_pool.mamba_cache
        rc = read_copy_of(self.mamba_pool)
        m = self.model
        for li in range(self.cfg.mamba_layers):
            mixed_qkv, a, b = m.decode_inputs(li, fed)
            out = torch.empty(len(reqs_), 1, m.HV, m.V)
            copy = None if rc is None else rc.layer_for(cache.temporal[li])
            if copy is not None:  # SGLANG_REPLAYSSM_READ_COPY: the CPU hook's read-copy step (radix/read_copy/store.py)
                decode_step(read_copy_decode_torch, copy, mixed_qkv, a, b, m.A_log[li], m.dt_bias[li].contiguous(),
                            m.K**-0.5, cache.temporal[li], cache.replayssm_k[li], cache.replayssm_g[li], out,
                            md.mamba_cache_indices, md.replayssm_write_pos, md.replayssm_force_flush,
                            is_kda=self.cfg.is_kda)  # fmt: skip
            else:
                ring_decode_torch(
                    mixed_qkv, a, b, m.A_log[li], m.dt_bias[li].contiguous(), m.K**-0.5, cache.temporal[li],
                    cache.replayssm_d[li], cache.replayssm_k[li], cache.replayssm_g[li], out,
                    md.mamba_cache_indices, md.replayssm_write_pos, md.replayssm_force_flush,
                    use_qk_l2norm_in_kernel=True, is_kda=self.cfg.is_kda, ring_map=self.ring_map,
                )
            for row, slot in enumerate(md.mamba_cache_indices.tolist()):
                self.conv[li, slot] = m.extend_conv(self.conv[li, slot], li, [int(fed[row])])
            with torch_track_copy(not self.cfg.triton_track_copy):
                backend._track_mamba_state_decode(
                    fb, self.conv[li], cache.temporal[li], md.mamba_cache_indices, li
                )
        # Result processing: track bookkeeping (SGLang's), the next token, finish.
        for i, sreq in enumerate(batch_reqs):
            req = sreq.req
            if self.cfg.extra_buffer:
                self._track_bookkeeping(req, batch, i)
            req.output_ids.append(sreq.script[len(req.output_ids)])
            if len(req.output_ids) >= len(sreq.script):
                self._finish(sreq)

    def _track_bookkeeping(self, req: Any, batch: Any, i: int) -> None:
        """The mamba part of ``BatchResultProcessor._handle_finish_state_updated_req`` with no
        overlap lookahead; the per-request update itself is SGLang's ``_mamba_prefix_cache_update``."""
        lazy = self.cfg.lazy
        boundary = bool(batch.mamba_track_mask_cpu[i])
        if boundary and not lazy:
            req.kv.mamba_last_track_idx = batch.mamba_track_buffer_indices[i]
            req.kv.mamba_prev_track_seqlen = req.kv.mamba_last_track_seqlen
            req.kv.mamba_last_track_seqlen = req.kv.kv_committed_len
        if boundary:
            result = SimpleNamespace(num_correct_drafts_per_req_cpu=None)
            self.results._mamba_prefix_cache_update(req, batch, result, i, known_boundary=not lazy)

    def _finish(self, sreq: SimReq) -> None:
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        req = sreq.req
        req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
        checkpoint = req.mamba_lazy_checkpoint if self.cfg.lazy else True
        release_kv_cache(req, self.cache, checkpoint=checkpoint)
        if sreq in self.running:
            self.running.remove(sreq)

    def finish_now(self, sreq: SimReq) -> None:
        """Finish a running request before its script ends (e.g. a stop token)."""
        del sreq.script[len(sreq.req.output_ids) :]
        self._finish(sreq)

    def abort(self, sreq: SimReq) -> None:
        """Abort a running request: SGLang's release without checkpoint (also the retract path)."""
        from sglang.srt.managers.schedule_batch import FINISH_ABORT
        from sglang.srt.mem_cache.common import release_kv_cache

        req = sreq.req
        req.finished_reason = FINISH_ABORT("simulated abort")
        release_kv_cache(req, self.cache, checkpoint=False)
        if sreq in self.running:
            self.running.remove(sreq)

    # -- paths that move a running request's state (issue 4) ----------------------------------------

    def extend_running(self, rows: Sequence[tuple[SimReq, Sequence[int]]], mode: str = "MIXED",
                       clear: Sequence[SimReq] = ()) -> None:
        """One extend-kind forward over running requests, as SGLang runs it.

        Each row feeds its last sampled token plus ``extra`` tokens: a MIXED decode row (``mode``
        ``"MIXED"``, no extra token) or a streaming session's next turn (``"EXTEND"``, the turn's
        new prompt as extra). SGLang's deferred copy-on-write / clear entry
        (``ModelRunner._maybe_execute_deferred_mamba_cow_and_clear``) runs first with the batch's
        ``req_pool_indices``; then the extend "kernel" runs the recurrence from each slot's
        ``temporal``, ignoring the ring, like SGLang's extend kernels. The fed extra tokens become
        part of the request (``output_ids``, as context) and one more token is sampled.
        """
        from sglang.srt.model_executor.forward_batch_info import ForwardMode
        from sglang.srt.model_executor.model_runner import ModelRunner

        starts = []
        for sreq, extra in rows:
            req = sreq.req
            n = 1 + len(extra)
            self._evict_kv(n)
            loc = self.allocator.alloc(n)
            pos = req.kv.kv_committed_len
            self.req_pool.write((req.kv.req_pool_idx, slice(pos, pos + n)), loc)
            starts.append(pos)
            req.kv.kv_committed_len += n
            req.kv.kv_allocated_len += n
            req.output_ids.extend(extra)
        clear_idx = (torch.tensor([int(s.req.kv.mamba_pool_idx) for s in clear], dtype=torch.int64)
                     if clear else None)
        fb = SimpleNamespace(
            forward_mode=ForwardMode[mode],
            req_pool_indices=torch.tensor([s.req.kv.req_pool_idx for s, _ in rows], dtype=torch.int64),
            mamba_clear_indices=clear_idx,
            mamba_cow_src_indices=None,
            mamba_cow_dst_indices=None,
        )
        runner = SimpleNamespace(req_to_token_pool=self.req_pool, is_draft_worker=False)
        ModelRunner._maybe_execute_deferred_mamba_cow_and_clear(runner, fb)
        for (sreq, extra), start in zip(rows, starts):
            req = sreq.req
            self._run_extend(int(req.kv.mamba_pool_idx), sreq.consumed, start, None)
            fed_before = len(req.output_ids) - len(extra)
            sreq.script = list(req.output_ids) + sreq.script[fed_before:]
            req.output_ids.append(sreq.script[len(req.output_ids)])
            if len(req.output_ids) >= len(sreq.script):
                self._finish(sreq)

    def retract(self, sreq: SimReq, *, backup: bool) -> None:
        """Retract a running request as ``ScheduleBatch.release_req`` does: on a PD decode server
        with ``backup`` (``cpu_tensor``: ``backup_kv_cache`` -> ``Req.offload_kv_cache``), then
        ``release_kv_cache(checkpoint=False)`` and ``Req.reset_for_retract``. Resume with
        :meth:`resume` (backup) or :meth:`recompute` (the non-PD path: re-prefill its tokens)."""
        from sglang.srt.mem_cache.common import backup_kv_cache, release_kv_cache

        req = sreq.req
        if backup and not backup_kv_cache(req, self.cache, self.req_pool, self.allocator, "cpu_tensor"):
            raise RuntimeError("cpu_tensor backup refused")
        release_kv_cache(req, self.cache, checkpoint=False)
        req.reset_for_retract()
        self.running.remove(sreq)

    def resume(self, sreq: SimReq) -> int:
        """Resume a request retracted with a CPU backup (``DecodePreallocQueue._pre_alloc`` sizes,
        then ``restore_kv_cache`` -> ``Req.load_kv_cache``): a new request row and mamba slot, KV
        for the ``seqlen - 1`` tokens already computed, the backup loaded. Returns the slot."""
        from sglang.srt.mem_cache.allocation import alloc_req_slots
        from sglang.srt.mem_cache.common import restore_kv_cache

        req = sreq.req
        n = req.seqlen - 1
        alloc_req_slots(self.req_pool, [req], self.cache)
        self._evict_kv(n)
        self.req_pool.write((req.kv.req_pool_idx, slice(0, n)), self.allocator.alloc(n))
        req.kv.kv_committed_len = req.kv.kv_allocated_len = n
        req.is_retracted = False
        restore_kv_cache(req, self.cache, self.req_pool, self.allocator, "cpu_tensor")
        self.running.append(sreq)
        return int(req.kv.mamba_pool_idx)

    def recompute(self, sreq: SimReq) -> SimReq:
        """Re-admit a request retracted without backup: SGLang re-prefills its fill ids (prompt +
        output so far), matching whatever prefix the tree holds."""
        sreq.req.is_retracted = False
        return self._start(sreq.req, sreq)

    @property
    def mamba_component(self) -> Any:
        """The cache's ``MambaComponent``."""
        from sglang.srt.mem_cache.unified_cache.components.base import ComponentType

        return next(c for c in self.cache._components_tuple if c.component_type == ComponentType.MAMBA)

    def next_mamba_slots(self, first: Sequence[int]) -> None:
        """Reorder the mamba allocator's free list so its next allocations return ``first`` (all
        free) in order, through the allocator's own alloc/free. The adapter's reset-on-alloc is
        held off for this bookkeeping alloc, so cursors of free slots stay as their last owner left
        them (what the path under test then allocates)."""
        from sglang_replayssm.radix import config

        alloc = self.req_pool.mamba_allocator
        with config.override(cursor_reset=False):
            free = alloc.alloc(alloc.available_size())
        rest = [int(x) for x in free.tolist() if int(x) not in set(first)]
        if len(rest) + len(first) != free.numel():
            raise ValueError(f"slots {list(first)} are not all free")
        alloc.free(torch.tensor([*first, *rest], dtype=free.dtype))

    def evict(self, num_tokens: int = 0, mamba_num: int = 0) -> Any:
        from sglang.srt.mem_cache.base_prefix_cache import EvictParams

        return self.cache.evict(EvictParams(num_tokens=num_tokens, mamba_num=mamba_num))

    def match(self, tokens: Sequence[int]) -> Any:
        """A probe match (no request, no copy-on-write)."""
        from sglang.srt.mem_cache.base_prefix_cache import MatchPrefixParams
        from sglang.srt.mem_cache.radix_cache import RadixKey

        return self.cache.match_prefix(MatchPrefixParams(key=RadixKey(array("q", tokens))))

    # -- invariants ---------------------------------------------------------------------------------
