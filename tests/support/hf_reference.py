"""Reference greedy tokens from Hugging Face transformers (float32, CPU), to check SGLang's output against.

``hf_greedy(model_dir, prompts, max_new_tokens)`` runs every prompt on its own (batch of one, so no
padding effects), prefill then one token at a time through the model's own cache, taking the
argmax each step. Results are cached on disk per (model, prompt ids, max_new_tokens, ignore_eos)
under ``~/.cache/sglang-replayssm/hf-ref`` (override with ``$SGLANG_REPLAYSSM_HF_REF_CACHE``), so a
repeated test run does not load the model at all.

The model is identified by the content hash in the marker file of an embedded model
(``sglang_replayssm.models.MARKER``); for any other directory, by a hash of its config and the
names, sizes and modification times of its weight files.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Any

CACHE_ENV = "SGLANG_REPLAYSSM_HF_REF_CACHE"
DEFAULT_CACHE_DIR = Path.home() / ".cache" / "sglang-replayssm" / "hf-ref"
_CACHE_FORMAT = 1


def cache_dir() -> Path:
    return Path(os.environ.get(CACHE_ENV) or DEFAULT_CACHE_DIR)


def model_fingerprint(model_dir: str | os.PathLike[str]) -> str:
    """A hash that changes whenever the model's weights or config do."""
    from sglang_replayssm.models import read_marker

    model_dir = Path(model_dir)
    marker = read_marker(model_dir)
    if marker and marker.get("content_hash"):
        return "marker:" + str(marker["content_hash"])
    h = hashlib.sha256()
    h.update((model_dir / "config.json").read_bytes())
    for path in sorted(model_dir.iterdir()):
        if path.suffix in {".safetensors", ".bin", ".json"} and path.is_file():
            st = path.stat()
            h.update(f"{path.name}:{st.st_size}:{st.st_mtime_ns}".encode())
    return "stat:" + h.hexdigest()


def _cache_key(fingerprint: str, ids: Sequence[int], max_new_tokens: int, ignore_eos: bool) -> str:
    blob = json.dumps([_CACHE_FORMAT, fingerprint, list(ids), max_new_tokens, ignore_eos])
    return hashlib.sha256(blob.encode()).hexdigest()


def _cache_read(key: str) -> list[int] | None:
    path = cache_dir() / f"{key}.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    out = data.get("output_ids")
    if isinstance(out, list) and all(isinstance(t, int) for t in out):
        return out
    return None


def _cache_write(key: str, record: dict[str, Any]) -> None:
    directory = cache_dir()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
        os.replace(tmp, directory / f"{key}.json")
    except OSError:
        pass  # a read-only cache only costs speed


@lru_cache(maxsize=4)
def _load(model_dir: str, fingerprint: str) -> tuple[Any, Any, list[int]]:
    """(model, tokenizer, eos ids) for a model directory, in float32 on CPU."""
    import torch
    import transformers

    config = json.loads((Path(model_dir) / "config.json").read_text())
    archs = config.get("architectures") or []
    cls = next((getattr(transformers, a) for a in archs if hasattr(transformers, a)), None)
    if cls is None:
        cls = transformers.AutoModelForCausalLM
    model = cls.from_pretrained(model_dir, dtype=torch.float32).eval()
    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    eos: list[int] = []
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(value, int):
            eos.append(value)
        elif isinstance(value, (list, tuple)):
            eos.extend(int(v) for v in value)
    return model, tokenizer, sorted(set(eos))


def _greedy_one(model: Any, ids: list[int], max_new_tokens: int, eos: set[int]) -> list[int]:
    import torch

    out_ids: list[int] = []
    if max_new_tokens <= 0:
        return out_ids
    with torch.inference_mode():
        out = model(torch.tensor([ids], dtype=torch.long), use_cache=True)
        while True:
            token = int(out.logits[0, -1].argmax())
            out_ids.append(token)
            if len(out_ids) >= max_new_tokens or token in eos:
                return out_ids
            out = model(torch.tensor([[token]], dtype=torch.long), past_key_values=out.past_key_values,
                        use_cache=True)


def encode_prompts(model_dir: str | os.PathLike[str], prompts: Sequence[str] | Sequence[Sequence[int]]) -> list[list[int]]:
    """Token ids of each prompt (strings go through the model's tokenizer, as SGLang's /generate does)."""
    out: list[list[int]] = []
    tokenizer = None
    for prompt in prompts:
        if isinstance(prompt, str):
            if tokenizer is None:
                from transformers import AutoTokenizer

                tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
            out.append([int(t) for t in tokenizer(prompt)["input_ids"]])
        else:
            out.append([int(t) for t in prompt])
    return out


def hf_greedy(
    model_dir: str | os.PathLike[str],
    prompts: Sequence[str] | Sequence[Sequence[int]],
    max_new_tokens: int,
    *,
    ignore_eos: bool = False,
    use_cache: bool = True,
) -> list[list[int]]:
    """transformers' float32 greedy continuation (token ids) of each prompt, run one prompt at a time.

    Generation stops after ``max_new_tokens`` tokens or, unless ``ignore_eos``, after an EOS token of
    the model's generation config (the EOS token is included, as in SGLang's ``output_ids``).
    The embedded models never emit special tokens, so for them ``ignore_eos`` changes nothing.
    """
    model_dir = str(Path(model_dir).resolve())
    fingerprint = model_fingerprint(model_dir)
    all_ids = encode_prompts(model_dir, prompts)
    results: list[list[int] | None] = [None] * len(all_ids)
    keys = [_cache_key(fingerprint, ids, max_new_tokens, ignore_eos) for ids in all_ids]
    if use_cache:
        for i, key in enumerate(keys):
            results[i] = _cache_read(key)
    missing = [i for i, r in enumerate(results) if r is None]
    if missing:
        model, _, eos = _load(model_dir, fingerprint)
        stop = set() if ignore_eos else set(eos)
        for i in missing:
            if not all_ids[i]:
                raise ValueError(f"prompt {i} is empty")
            results[i] = _greedy_one(model, all_ids[i], max_new_tokens, stop)
            if use_cache:
                _cache_write(keys[i], {"model": model_dir, "fingerprint": fingerprint, "input_ids": all_ids[i],
                                       "max_new_tokens": max_new_tokens, "ignore_eos": ignore_eos,
                                       "output_ids": results[i]})
    return [list(r) for r in results if r is not None]


def hf_margins(model_dir: str | os.PathLike[str], prompts: Sequence[Sequence[int]],
               continuations: Sequence[Sequence[int]]) -> list[list[float]]:
    """Per prompt, per token ``i`` of its continuation: transformers' float32 gap between the two largest
    logits at the step that chose token ``i`` (teacher forced on ``prompt + continuation[:i]``). A small gap
    is a near tie, which a kernel that rounds differently (a bf16 state copy) may decide the other way."""
    import torch

    model_dir = str(Path(model_dir).resolve())
    model, _, _ = _load(model_dir, model_fingerprint(model_dir))
    out: list[list[float]] = []
    with torch.inference_mode():
        for ids, cont in zip(prompts, continuations):
            seq = [int(t) for t in ids] + [int(t) for t in cont][:-1]
            logits = model(torch.tensor([seq], dtype=torch.long)).logits[0, len(ids) - 1:].float()
            top2 = logits.topk(2, dim=-1).values
            out.append((top2[:, 0] - top2[:, 1]).tolist())
    return out
