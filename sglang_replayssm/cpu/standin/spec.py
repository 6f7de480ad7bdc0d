"""`sgl_kernel` CPU functions of SGLang 0.5.23's EAGLE / NEXTN path, as torch references.

Chain drafts only (``--speculative-eagle-topk 1``, the only shape the CPU runtime serves): a tree
(topk > 1) is refused in one line. Each function keeps the argument order of its SGLang call site,
named in its docstring; the semantics are those of SGLang's Triton kernels of the same name.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import torch

from sglang_replayssm.cpu.standin.ops import PYTHON_API


def _api(fn: Callable) -> Callable:
    PYTHON_API[fn.__name__] = fn
    return fn


@_api
def copy_all_layer_kv_cache_cpu(data_ptrs: torch.Tensor, strides: torch.Tensor, tgt_loc: torch.Tensor,
                                src_loc: torch.Tensor) -> None:
    """Copy token rows ``src_loc -> tgt_loc`` in every KV buffer (kernels/ops/kvcache/cache_move.py:191):
    ``data_ptrs[i]`` is buffer i's base address, ``strides[i]`` its row size in bytes (one row = one slot)."""
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for ptr, stride in zip(data_ptrs.tolist(), strides.tolist()):
        for tgt, src in pairs:
            if tgt != src:
                ctypes.memmove(ptr + tgt * stride, ptr + src * stride, stride)


def _chain_only(topk: int, what: str) -> None:
    if topk != 1:
        raise NotImplementedError(
            f"{what}: the CPU runtime serves chain drafts only; pass --speculative-eagle-topk 1 (got {topk})")


@_api
def build_tree_kernel_efficient_cpu(parent_list, selected_index, verified_seq_len, tree_mask, positions,
                                    retrieve_index, retrieve_next_token, retrieve_next_sibling, topk: int,
                                    depth: int, draft_token_num: int, tree_mask_mode: int) -> None:
    """The EAGLE tree of a chain (kernels/ops/speculative/spec_tree.py:410): draft i's parent is i-1,
    so position = seq_len + i, next_token = i+1 (none after the last), no siblings, and each draft sees
    the verified prefix and drafts 0..i (mask modes FULL_MASK = 0 and QLEN_ONLY = 1)."""
    _chain_only(topk, "build_tree_kernel_efficient_cpu")
    if int(tree_mask_mode) not in (0, 1):
        raise NotImplementedError(f"build_tree_kernel_efficient_cpu: tree mask mode {int(tree_mask_mode)}")
    n = draft_token_num
    bs = verified_seq_len.shape[0]
    seq = verified_seq_len.tolist()
    steps = torch.arange(n, device=positions.device)
    tri = torch.ones(n, n, dtype=torch.bool).tril()
    offset = 0
    for b in range(bs):
        positions[b * n:(b + 1) * n] = seq[b] + steps
        retrieve_index[b] = b * n + steps
        retrieve_next_token[b, : n - 1] = steps[1:]
        retrieve_next_token[b, n - 1] = -1
        retrieve_next_sibling[b] = -1
        if int(tree_mask_mode) == 0:  # FULL_MASK: row i = [prefix (left as SGLang filled it) | drafts]
            width = seq[b] + n
            rows = tree_mask[offset:offset + n * width].view(n, width)
            rows[:, seq[b]:] = tri.to(rows.dtype)
            offset += n * width
        else:  # QLEN_ONLY: [n, n] per request
            tree_mask[b * n * n:(b + 1) * n * n].view(n, n)[:] = tri.to(tree_mask.dtype)


@_api
def verify_tree_greedy_cpu(*, predicts, accept_index, accept_token_num, candidates, retrive_index,
                           retrive_next_token, retrive_next_sibling, target_predict) -> None:
    """Greedy tree walk (kernels/ops/speculative/spec_tree.py:501): from the root, follow the child
    whose draft token equals the target's prediction at the last accepted node, as
    ``verify_tree_greedy_kernel_triton`` does; writes predicts, accept_index, accept_token_num."""
    bs, n = candidates.shape
    steps = accept_index.shape[1]
    nxt, sib = retrive_next_token.tolist(), retrive_next_sibling.tolist()
    idx, cand = retrive_index.tolist(), candidates.tolist()
    target = target_predict.reshape(-1).tolist()
    for b in range(bs):
        last = idx[b][0]
        accept_index[b, 0] = last
        accepted, cur = 0, 0
        for _ in range(1, steps):
            cur = nxt[b][cur]
            want = target[last]
            while cur != -1 and cand[b][cur] != want:
                cur = sib[b][cur]
            if cur == -1:
                break
            predicts[last] = want
            accepted += 1
            accept_index[b, accepted] = idx[b][cur]
            last = idx[b][cur]
        accept_token_num[b] = accepted
        predicts[last] = target[last]


@_api
def assign_draft_cache_locs_contiguous_cpu(req_pool_indices, req_to_token, seq_lens, out_cache_loc,
                                           pool_len: int, topk: int, num_cols: int) -> None:
    """Row i of out_cache_loc (topk*num_cols wide) = req_to_token[req i, seq_len_i : + topk*num_cols]
    (kernels/ops/speculative/cache_locs.py:99)."""
    width = topk * num_cols
    out = out_cache_loc.view(-1)
    for i, (req, start) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        out[i * width:(i + 1) * width] = req_to_token[req, start:start + width].to(out.dtype)


@_api
def assign_extend_cache_locs_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """Pack req_to_token[req i, start_i:end_i] for every request, in order, into out_cache_loc
    (kernels/ops/speculative/cache_locs.py:765)."""
    pos = 0
    for req, lo, hi in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if hi > lo:
            out_cache_loc[pos:pos + hi - lo] = req_to_token[req, lo:hi].to(out_cache_loc.dtype)
            pos += hi - lo


@_api
def fill_bonus_tokens_cpu(accept_tokens, accept_lens, bonus_tokens, accept_stride: int) -> None:
    """bonus_tokens[i] = the last accepted token of request i (kernels/ops/speculative/eagle.py:40)."""
    flat = accept_tokens.reshape(-1)
    for i, n in enumerate(accept_lens.tolist()):
        bonus_tokens[i] = flat[accept_stride * i + n - 1]


@_api
def fill_accept_out_cache_loc_cpu(accept_index, out_cache_loc, accept_out_cache_loc) -> None:
    """Compact out_cache_loc[accept_index[j]] over the accepted entries (!= -1), in order
    (kernels/ops/speculative/eagle.py:80)."""
    flat = accept_index.reshape(-1)
    keep = flat[flat != -1].long()
    accept_out_cache_loc[: keep.numel()] = out_cache_loc[keep].to(accept_out_cache_loc.dtype)


@_api
def assign_req_to_token_pool_cpu(req_pool_indices, req_to_token, start_offset, end_offset, out_cache_loc,
                                 pool_len: int) -> None:
    """The inverse of assign_extend_cache_locs_cpu: req_to_token[req i, start_i:end_i] = the next
    end_i - start_i entries of out_cache_loc, requests in order (mem_cache/allocation.py:746)."""
    pos = 0
    for req, lo, hi in zip(req_pool_indices.tolist(), start_offset.tolist(), end_offset.tolist()):
        if hi > lo:
            req_to_token[req, lo:hi] = out_cache_loc[pos:pos + hi - lo].to(req_to_token.dtype)
            pos += hi - lo
