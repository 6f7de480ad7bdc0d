"""The synthetic English-like corpus (seeded word list) and the byte-level BPE tokenizer trained on it."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

from sglang_replayssm.models.specs import (
    CHAT_TEMPLATE,
    CORPUS_SEED,
    CORPUS_SENTENCES,
    SPECIAL_TOKENS,
    TOKENIZER_VOCAB,
)

_FUNCTION_WORDS = (
    "the of and to a in is that it for on was with as by at from this be are or an which not have "
    "has had but they we you he she his her their its our one all can will would there what when "
    "who how more some into than then so if no about up out only other also after new first two "
    "may these could most over such very just where must through each much before do does did "
    "under between while because both few many same well"
).split()
_CONTENT_WORDS = (
    "river stone garden window market letter morning city water light house paper table road "
    "winter summer forest mountain village harbor engine signal number system model cache prefix "
    "token layer state memory server request answer question document report story reader "
    "teacher student doctor farmer builder library kitchen bridge valley island ocean cloud "
    "rain wind fire metal glass silver golden quiet bright small large early late simple careful "
    "ancient modern open closed green blue red white black north south east west walk read write "
    "build carry follow remember measure compare describe explain travel gather notice improve"
).split()
_ONSETS = ("", "b", "bl", "br", "c", "ch", "cl", "d", "dr", "f", "fl", "fr", "g", "gl", "gr", "h", "j", "k",
           "l", "m", "n", "p", "pl", "pr", "qu", "r", "s", "sc", "sh", "sl", "sp", "st", "t", "th", "tr",
           "v", "w", "wh", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "ee", "ie", "oa", "oo", "ou", "y")
_CODAS = ("", "", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng", "ck", "rd", "rt", "x", "sh", "th")
_SUFFIXES = ("", "", "", "", "s", "ed", "ing", "er", "ly", "ion", "ness", "ment", "able")


@lru_cache(maxsize=4)
def synthetic_words(seed: int = CORPUS_SEED, n_generated: int = 1800) -> tuple[str, ...]:
    """A fixed English-like lexicon: common words first, then seeded pseudo-words (rank order)."""
    rng = random.Random(seed)
    words: list[str] = list(_FUNCTION_WORDS) + list(_CONTENT_WORDS)
    seen = set(words)
    while len(words) < len(_FUNCTION_WORDS) + len(_CONTENT_WORDS) + n_generated:
        n_syll = rng.choices((1, 2, 3, 4), weights=(3, 5, 3, 1))[0]
        word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n_syll))
        word += rng.choice(_SUFFIXES)
        if 2 <= len(word) <= 14 and word not in seen:
            seen.add(word)
            words.append(word)
    return tuple(words)


def synthetic_sentences(n: int, seed: int = CORPUS_SEED) -> Iterator[str]:
    """``n`` deterministic English-like sentences (Zipf-distributed words, punctuation, numbers)."""
    words = synthetic_words()
    weights = [1.0 / (rank + 1) ** 1.05 for rank in range(len(words))]
    cum: list[float] = []
    total = 0.0
    for w in weights:
        total += w
        cum.append(total)
    rng = random.Random(seed + 1)
    for _ in range(n):
        length = rng.randint(4, 18)
        picked = rng.choices(words, cum_weights=cum, k=length)
        parts: list[str] = []
        for i, word in enumerate(picked):
            if rng.random() < 0.03:
                word = str(rng.randint(0, 2024))
            if i == 0:
                word = word[:1].upper() + word[1:]
            elif rng.random() < 0.05:
                word = word[:1].upper() + word[1:]
            parts.append(word)
            if i < length - 1 and rng.random() < 0.08:
                parts[-1] += ","
        end = rng.choices((".", "?", "!", ":"), weights=(85, 8, 4, 3))[0]
        yield " ".join(parts) + end


def synthetic_text(n_sentences: int, seed: int = CORPUS_SEED) -> str:
    """Paragraphs of ``synthetic_sentences`` (for prompts that tokenize like the training corpus)."""
    rng = random.Random(seed + 2)
    out: list[str] = []
    for sentence in synthetic_sentences(n_sentences, seed):
        out.append(sentence)
        out.append("\n\n" if rng.random() < 0.15 else " ")
    return "".join(out).rstrip()


def _corpus_lines() -> Iterator[str]:
    rng = random.Random(CORPUS_SEED + 3)
    batch: list[str] = []
    for sentence in synthetic_sentences(CORPUS_SENTENCES):
        batch.append(sentence)
        if len(batch) >= rng.randint(3, 8):
            yield " ".join(batch)
            batch = []
    if batch:
        yield " ".join(batch)
    # a few chat-shaped samples so role names and newlines merge sensibly
    for i, sentence in enumerate(synthetic_sentences(400, CORPUS_SEED + 4)):
        role = ("system", "user", "assistant")[i % 3]
        yield f"{role}\n{sentence}\n"


@lru_cache(maxsize=1)
def _tokenizer_json() -> str:
    """The trained tokenizer, serialized (tokenizer.json contents); deterministic."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=TOKENIZER_VOCAB,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus_lines(), trainer=trainer)
    for i, token in enumerate(SPECIAL_TOKENS):
        assert tok.token_to_id(token) == i, (token, tok.token_to_id(token))
    return tok.to_str(pretty=True)


def _tokenizer_config() -> dict[str, Any]:
    added = {
        str(i): {"content": t, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
                 "special": True}
        for i, t in enumerate(SPECIAL_TOKENS)
    }
    return {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|im_end|>",
        "errors": "replace",
        "model_max_length": 32768,
        "pad_token": "<|pad|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }


def tokenizer_vocab_size() -> int:
    return len(json.loads(_tokenizer_json())["model"]["vocab"])
