"""The embedded GDN models' MTP draft layer (weights under ``mtp.*``, as Qwen3.5 checkpoints ship it;
SGLang 0.5.23 serves it as ``Qwen3_5ForCausalLMMTP`` for ``--speculative-algorithm NEXTN``,
transformers ignores it), fitted offline to the model's own greedy continuations.

A random-weight MTP head accepts almost nothing, and so does a fitted one on unseen prompts: the
tiny models' greedy continuations are not predictable from a token and the last hidden state (a
least-squares map reaches 0.5 % next-token agreement, a fitted layer 0.4 % on held-out prompts). So
the layer is fitted to memorise the continuations of a fixed, seeded prompt set
(:func:`fit_prompts`): served on those prompts, NEXTN accepts most drafts, which is what exercises
the paths where accepted records pend across verify steps. The layer reads tokens only (the
hidden-state half of ``mtp.fc`` is zero), so a draft step on its own output is the same function as
one on the target's. Fitting is deterministic (seeded init, one thread, fixed Adam steps) and takes
seconds; the main weights are untouched (the MTP tensors come from their own generator).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from sglang_replayssm.models.specs import SPECIAL_TOKENS, ModelSpec

#: Prompt set the layer is fitted to: groups of prompts sharing a prefix, then distinct suffixes.
FIT_GROUPS, FIT_PER_GROUP, FIT_PREFIX, FIT_SUFFIX = 4, 4, 32, 8
#: Greedy tokens generated per prompt (the fitted continuation).
FIT_NEW_TOKENS = 48
FIT_STEPS, FIT_LR = 300, 3e-3


def fit_prompts(spec: ModelSpec, vocab: int) -> list[list[int]]:
    """The prompts the MTP layer of ``spec`` is fitted on (token ids; no special tokens)."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed + 101)
    lo = len(SPECIAL_TOKENS)
    prompts = []
    for _ in range(FIT_GROUPS):
        prefix = torch.randint(lo, vocab, (FIT_PREFIX,), generator=gen).tolist()
        for _ in range(FIT_PER_GROUP):
            prompts.append(prefix + torch.randint(lo, vocab, (FIT_SUFFIX,), generator=gen).tolist())
    return prompts


def mtp_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json additions that declare one MTP layer."""
    return {"mtp_num_hidden_layers": 1}


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _rms(x: Any, weight: Any = None) -> Any:
    import torch

    y = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
    return y if weight is None else y * (1.0 + weight)


def mtp_state_dict(spec: ModelSpec, cfg: dict[str, Any], model: Any) -> dict[str, Any]:
    """The ``mtp.*`` tensors for the transformers model ``model`` (float32), fitted as described above."""
    import torch
    import transformers

    from sglang_replayssm.models.weights import _default_dtype, hf_config_class

    hidden, vocab = cfg["hidden_size"], cfg["vocab_size"]
    one = dict(cfg, num_hidden_layers=1, layer_types=["full_attention"], full_attention_interval=1)
    hf_one = hf_config_class(spec.family).from_dict(one)
    hf_one._attn_implementation = "eager"
    with _one_thread(), _default_dtype(torch.float32):
        prompts = torch.tensor(fit_prompts(spec, vocab))
        with torch.no_grad():
            seqs = model.generate(prompts, max_new_tokens=FIT_NEW_TOKENS, min_new_tokens=FIT_NEW_TOKENS,
                                  do_sample=False, pad_token_id=cfg["pad_token_id"])
            target = model(input_ids=seqs).logits.argmax(-1)  # target[:, j]: the greedy token after seqs[:, :j+1]
        torch.manual_seed(spec.seed + 202)
        layer = transformers.Qwen3_5TextModel(hf_one).float()
        fc = torch.nn.Linear(hidden, hidden, bias=False)
        norm_e = torch.nn.Parameter(torch.zeros(hidden))
        embed = model.model.embed_tokens.weight.detach()
        head = model.lm_head.weight.detach()
        # draft position j reads token seqs[:, j+1] and predicts target[:, j+1]; scored from the first
        # draft of a request on (its last prompt position)
        inputs, labels = seqs[:, 1:], target[:, 1:]
        first = prompts.shape[1] - 1
        params = [p for n, p in layer.named_parameters() if not n.startswith("embed_tokens")]
        params += [fc.weight, norm_e]
        opt = torch.optim.Adam(params, lr=FIT_LR)
        for _ in range(FIT_STEPS):
            out = layer(inputs_embeds=fc(_rms(embed[inputs], norm_e))).last_hidden_state
            logits = out[:, first:] @ head.t()
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, vocab), labels[:, first:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
    sd = {f"mtp.{k}": v for k, v in layer.state_dict().items() if not k.startswith("embed_tokens")
          and "rotary_emb" not in k}
    sd["mtp.fc.weight"] = torch.cat([fc.weight, torch.zeros(hidden, hidden)], dim=1)
    sd["mtp.pre_fc_norm_embedding.weight"] = norm_e.detach()
    sd["mtp.pre_fc_norm_hidden.weight"] = torch.zeros(hidden)
    return {k: v.detach().to(torch.float32).contiguous().clone() for k, v in sd.items()}
