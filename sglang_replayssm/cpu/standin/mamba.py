"""`sgl_kernel.mamba` stand-in: the Python wrappers SGLang imports, over the torch ops in ops.py."""

from __future__ import annotations

from sglang_replayssm.cpu.standin import ops


def causal_conv1d_fn_cpu(x, weight, bias, activation, conv_states, has_initial_state, cache_indices,
                         query_start_loc, seq_lens_cpu=None, **unused):
    return ops.causal_conv1d_fwd_cpu(x, weight, bias, conv_states, query_start_loc, cache_indices,
                                     has_initial_state, activation == "silu")


def causal_conv1d_update_cpu(x, conv_states, weight, bias, activation, conv_state_indices, **unused):
    if unused.get("intermediate_conv_window") is not None:  # speculative verify (cpu/spec_standin.py)
        from sglang_replayssm.cpu import spec_standin

        tree = {k: unused.pop(k, None) for k in ("retrieve_next_token", "retrieve_next_sibling",
                                                  "retrieve_parent_token")}
        spec_standin._refuse_tree("causal_conv1d_update_cpu", **tree)
        return spec_standin.conv_update_verify(x, conv_states, weight, bias, activation == "silu",
                                               conv_state_indices, unused.pop("intermediate_conv_window"),
                                               unused.pop("intermediate_state_indices"))
    if any(v is not None for v in unused.values()):
        raise NotImplementedError(f"causal_conv1d_update_cpu: unsupported arguments {sorted(unused)}")
    return ops.causal_conv1d_update_cpu(x, conv_states, weight, bias, activation == "silu", None,
                                        conv_state_indices)


def chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, cu_seqlens, head_first,
                               use_qk_l2norm_in_kernel, initial_state_indices, **unused):
    return ops.chunk_gated_delta_rule_cpu(q, k, v, g, beta, initial_state, True, cu_seqlens, head_first,
                                          use_qk_l2norm_in_kernel, initial_state_indices)
