"""Torch references of the paged attention ops SGLang 0.5.23's ``intel_amx`` backend calls
(layers/attention/intel_amx_backend.py), the CPU attention backend that serves EAGLE / NEXTN:
target verify (causal over the drafts of a chain), draft extend and the draft's multi-step decode.

fp32 math, one request at a time. What the CPU runtime does not serve is refused in one line:
sliding windows, logit caps, attention sinks, cross attention and tree masks (topk > 1).
"""

from __future__ import annotations

import torch

from sglang_replayssm.cpu.standin.ops import PYTHON_API, op


def _refuse(what: str, logit_cap: float, is_cross: bool, window: int, sinks, tree_mask=None) -> None:
    bad = [name for name, on in (("logit cap", logit_cap and logit_cap > 0), ("cross attention", is_cross),
                                 ("sliding window", window > 0), ("attention sinks", sinks is not None),
                                 ("tree mask (topk > 1)", tree_mask is not None)) if on]
    if bad:
        raise NotImplementedError(f"{what}: the CPU runtime's reference does not serve {', '.join(bad)}")


def _attend(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scaling: float, causal_from: int | None
            ) -> torch.Tensor:
    """q [Tq,H,D], keys/values [Tk,Hkv,D*]; query t sees keys [0, causal_from + t] (None: all)."""
    h, hkv = q.shape[1], keys.shape[1]
    if h != hkv:
        keys = keys.repeat_interleave(h // hkv, dim=1)
        values = values.repeat_interleave(h // hkv, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q.float(), keys.float()) * scaling
    if causal_from is not None:
        tq, tk = q.shape[0], keys.shape[0]
        visible = torch.arange(tk)[None, :] <= (causal_from + torch.arange(tq))[:, None]
        scores = scores.masked_fill(~visible, float("-inf"))
    return torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values.float())


@op
def extend_attention_cpu(q, k, v, o, key_buffer, value_buffer, key_scale, value_scale, req_to_token,
                         req_pool_indices, seq_lens, extend_seq_lens, extend_start_loc, max_extend_len, scaling,
                         logit_cap, is_cross, window, encoder_lens, sinks, tree_mask, is_causal) -> None:
    """Extend / verify attention (intel_amx_backend.py forward_extend): request b's extend tokens
    attend to its cached prefix (req_to_token[req, :seq_len - extend_len], read from the buffers) and
    causally to its extend tokens (k, v; also already written to the buffers). Writes o."""
    _refuse("extend_attention_cpu", logit_cap, is_cross, window, sinks, tree_mask)
    if key_scale not in (None, 1.0) or value_scale not in (None, 1.0):
        raise NotImplementedError("extend_attention_cpu: scaled (fp8) KV is not served by the CPU runtime")
    for req, total, ext, start in zip(req_pool_indices.tolist(), seq_lens.tolist(),
                                      extend_seq_lens.tolist(), extend_start_loc.tolist()):
        if ext <= 0:
            continue
        prefix = total - ext
        locs = req_to_token[req, :prefix].long()
        keys = torch.cat([key_buffer[locs].to(k.dtype), k[start:start + ext]], dim=0)
        values = torch.cat([value_buffer[locs].to(v.dtype), v[start:start + ext]], dim=0)
        out = _attend(q[start:start + ext], keys, values, scaling, prefix if is_causal else None)
        o[start:start + ext] = out.to(o.dtype)


@op
def decode_attention_cpu(q, key_buffer, value_buffer, key_scale, value_scale, o, k, v, cache_loc, attn_logits,
                         req_to_token, req_pool_indices, seq_lens, scaling, logit_cap, is_cross, window,
                         encoder_lens=None, sinks=None) -> None:
    """Decode attention (intel_amx_backend.py forward_decode): k/v (when given) are written to the
    buffers at cache_loc first, then row b attends to req_to_token[req_b, :seq_len_b]. Writes o."""
    _refuse("decode_attention_cpu", logit_cap, is_cross, window, sinks)
    if key_scale not in (None, 1.0) or value_scale not in (None, 1.0):
        raise NotImplementedError("decode_attention_cpu: scaled (fp8) KV is not served by the CPU runtime")
    if k is not None and v is not None:
        loc = cache_loc.long()
        key_buffer[loc] = k.reshape(key_buffer[loc].shape).to(key_buffer.dtype)
        value_buffer[loc] = v.reshape(value_buffer[loc].shape).to(value_buffer.dtype)
    for b, (req, total) in enumerate(zip(req_pool_indices.tolist(), seq_lens.tolist())):
        locs = req_to_token[req, :total].long()
        out = _attend(q[b:b + 1], key_buffer[locs], value_buffer[locs], scaling, None)
        o[b] = out[0].to(o.dtype)


def build_draft_decode_metadata_cpu(req_to_token, req_pool_indices, seq_lens, topk: int, num_steps: int,
                                    pool_len: int) -> torch.Tensor:
    """The draft decode's token table, one row per candidate (intel_amx_backend.py
    IntelAMXMultiStepDraftBackend): for a chain (topk 1) each request's own row, whose slots from
    seq_len on already hold its draft tokens' KV locations."""
    if topk != 1:
        raise NotImplementedError(
            f"build_draft_decode_metadata_cpu: the CPU runtime serves chain drafts only; pass "
            f"--speculative-eagle-topk 1 (got {topk})")
    return req_to_token[req_pool_indices.long()].clone()


PYTHON_API["build_draft_decode_metadata_cpu"] = build_draft_decode_metadata_cpu
