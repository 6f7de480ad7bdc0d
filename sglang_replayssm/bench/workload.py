"""Synthetic shared-prefix workloads as token ids, so every prompt length is exact.

Two shapes, both deterministic in their seed:

* ``gsp``: SGLang's generated-shared-prefix shape (``sglang.benchmark.datasets.generated_shared_prefix``):
  groups of prompts that share a system prompt, each followed by its own question; groups uniform
  or zipf-distributed, sent ordered or shuffled. With more than one turn, each later turn appends
  the previous answer and a new question to the conversation.
* ``mtp-fit``: the prompts an embedded model's MTP layer was fitted to (models/mtp.py), one turn
  each, so NEXTN arms accept most drafts (on other prompts the tiny models' drafts accept ~0).
* ``rag``: multi-turn retrieval chat. Every conversation starts with one shared system prompt and
  one document from a small corpus, so the prefix tree branches twice (system prompt, then
  document); later turns carry the whole history (documents included) forward and add a question.

A conversation's later turns depend on the server's answers, so a turn holds only the tokens it
appends; the client builds the prompt as ``history + new_ids``.

Within a group, questions start with distinct tokens and groups start with distinct tokens, so
the longest common prefix of two prompts is exactly the part they are meant to share.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Turn:
    new_ids: tuple[int, ...]  # tokens appended after the conversation's history
    output_len: int


@dataclass(frozen=True)
class Conversation:
    cid: int  # position in send order; request ids are f"{cid}.{turn}"
    group: int  # gsp group, or rag document
    shared_len: int  # leading tokens of turn 0 shared by every conversation of the group
    turns: tuple[Turn, ...]

    def rid(self, turn: int) -> str:
        return f"{self.cid}.{turn}"


@dataclass(frozen=True)
class TurnSpec:
    """The turns of every conversation of a stream: questions, answers, their spread, send order."""

    question_len: int = 64
    output_len: int = 16
    range_ratio: float = 1.0  # each length is drawn from [range_ratio * full, full]
    num_turns: int = 1
    zipf_alpha: float | None = None
    ordered: bool = False


@dataclass(frozen=True)
class GspSpec(TurnSpec):
    num_groups: int = 4
    prompts_per_group: int = 4
    system_prompt_len: int = 1024
    group_distribution: str = "uniform"  # or "zipf"


@dataclass(frozen=True)
class RagSpec(TurnSpec):
    num_docs: int = 4
    doc_len: int = 768
    system_prompt_len: int = 256
    num_conversations: int = 8
    num_turns: int = 2
    doc_distribution: str = "uniform"  # or "zipf"


class WorkloadError(ValueError):
    """A workload spec that cannot be generated."""


class _Draw:
    """Token and length draws from one seeded stream."""

    def __init__(self, vocab: Sequence[int], seed: int) -> None:
        if len(vocab) < 2:
            raise WorkloadError("the vocabulary must hold at least 2 token ids")
        self.vocab = list(vocab)
        self.rng = random.Random(seed)

    def length(self, full: int, range_ratio: float) -> int:
        if full <= 0:
            return 0
        low = max(int(full * range_ratio), 1)
        return self.rng.randint(low, full)

    def ids(self, n: int, avoid_first: set[int] | None = None) -> tuple[int, ...]:
        if n <= 0:
            return ()
        first = self.rng.choice(self.vocab)
        if avoid_first is not None:
            if len(avoid_first) >= len(self.vocab):
                raise WorkloadError(
                    f"the vocabulary ({len(self.vocab)} ids) is too small for distinct prompt starts"
                )
            while first in avoid_first:
                first = self.rng.choice(self.vocab)
            avoid_first.add(first)
        return (first, *self.rng.choices(self.vocab, k=n - 1))


def _check_distribution(name: str, alpha: float | None) -> None:
    if name not in ("uniform", "zipf"):
        raise WorkloadError(f"distribution must be 'uniform' or 'zipf', got {name!r}")
    if name == "zipf" and (alpha is None or not alpha > 0):
        raise WorkloadError("zipf distribution needs an alpha > 0")


def zipf_weights(n: int, alpha: float) -> list[float]:
    """Probability of rank 1..n (index 0 hottest), proportional to 1 / rank**alpha."""
    raw = [1.0 / (rank**alpha) for rank in range(1, n + 1)]
    total = sum(raw)
    return [w / total for w in raw]


def _assign(n_slots: int, n_groups: int, per_group: int, distribution: str, alpha: float | None,
            rng: random.Random) -> list[int]:
    """Group of each slot: per_group of each under uniform, sampled by rank under zipf."""
    if distribution == "uniform":
        return [slot // per_group for slot in range(n_slots)]
    assert alpha is not None
    return rng.choices(range(n_groups), weights=zipf_weights(n_groups, alpha), k=n_slots)


def _positive(**values: int) -> None:
    for name, value in values.items():
        if value < 1:
            raise WorkloadError(f"{name} must be >= 1, got {value}")


def generate_gsp(spec: GspSpec, vocab: Sequence[int], seed: int) -> list[Conversation]:
    """SGLang's generated-shared-prefix shape; one conversation per prompt slot."""
    _positive(num_groups=spec.num_groups, prompts_per_group=spec.prompts_per_group,
              system_prompt_len=spec.system_prompt_len, question_len=spec.question_len,
              output_len=spec.output_len, num_turns=spec.num_turns)
    _check_distribution(spec.group_distribution, spec.zipf_alpha)
    draw = _Draw(vocab, seed)
    group_starts: set[int] = set()
    systems = [draw.ids(draw.length(spec.system_prompt_len, spec.range_ratio), group_starts)
               for _ in range(spec.num_groups)]
    n_slots = spec.num_groups * spec.prompts_per_group
    assignment = _assign(n_slots, spec.num_groups, spec.prompts_per_group, spec.group_distribution,
                         spec.zipf_alpha, random.Random(seed + 1))
    return _conversations(spec, draw, assignment, systems, seed)


def generate_rag(spec: RagSpec, vocab: Sequence[int], seed: int) -> list[Conversation]:
    """Multi-turn RAG chat: shared system prompt, one corpus document per conversation."""
    _positive(num_docs=spec.num_docs, doc_len=spec.doc_len, system_prompt_len=spec.system_prompt_len,
              num_conversations=spec.num_conversations, num_turns=spec.num_turns,
              question_len=spec.question_len, output_len=spec.output_len)
    _check_distribution(spec.doc_distribution, spec.zipf_alpha)
    draw = _Draw(vocab, seed)
    system = draw.ids(spec.system_prompt_len)
    doc_starts: set[int] = set()
    docs = [draw.ids(draw.length(spec.doc_len, spec.range_ratio), doc_starts)
            for _ in range(spec.num_docs)]
    per_doc = -(-spec.num_conversations // spec.num_docs)
    assignment = _assign(spec.num_conversations, spec.num_docs, per_doc, spec.doc_distribution,
                         spec.zipf_alpha, random.Random(seed + 1))
    return _conversations(spec, draw, assignment, [system + doc for doc in docs], seed)


def _conversations(spec: TurnSpec, draw: _Draw, assignment: list[int], prefixes: list[tuple[int, ...]],
                   seed: int) -> list[Conversation]:
    """One conversation per slot of ``assignment`` (its group), put in send order (:func:`_order`): turn 0
    is the group's shared prefix and a question starting with a token no other question of the group
    starts with; each later turn a new question."""
    question_starts: list[set[int]] = [set() for _ in prefixes]
    conversations = []
    for cid, group in enumerate(assignment):
        turns = []
        for t in range(spec.num_turns):
            q = draw.ids(draw.length(spec.question_len, spec.range_ratio), question_starts[group] if t == 0 else None)
            new_ids = prefixes[group] + q if t == 0 else q
            turns.append(Turn(new_ids, draw.length(spec.output_len, spec.range_ratio)))
        conversations.append(Conversation(cid, group, len(prefixes[group]), tuple(turns)))
    return _order(conversations, spec.ordered, seed)


def fitted_conversations(prompts: Sequence[Sequence[int]], group_size: int, shared_len: int, output_len: int,
                         ordered: bool, seed: int) -> list[Conversation]:
    """One single-turn conversation per prompt of a fixed set (an embedded model's MTP fit prompts,
    models/mtp.py: every ``group_size`` consecutive prompts share their first ``shared_len`` tokens)."""
    _positive(prompts=len(prompts), group_size=group_size, output_len=output_len)
    conversations = [Conversation(i, i // group_size, shared_len, (Turn(tuple(p), output_len),))
                     for i, p in enumerate(prompts)]
    return _order(conversations, ordered, seed)


def _order(conversations: list[Conversation], ordered: bool, seed: int) -> list[Conversation]:
    """Send order: as generated, or shuffled; cids are renumbered to the send order."""
    if not ordered:
        random.Random(seed + 2).shuffle(conversations)
    return [Conversation(i, c.group, c.shared_len, c.turns) for i, c in enumerate(conversations)]


def warmup_requests(n: int, vocab: Sequence[int], seed: int, avoid_first: set[int],
                    input_len: int = 16, output_len: int = 4) -> list[Turn]:
    """Short single-turn requests whose first token matches no workload prompt."""
    draw = _Draw(vocab, seed + 3)
    avoid = set(avoid_first)
    return [Turn(draw.ids(input_len, avoid), output_len) for _ in range(n)]


def first_tokens(conversations: Sequence[Conversation]) -> set[int]:
    return {c.turns[0].new_ids[0] for c in conversations if c.turns and c.turns[0].new_ids}


def describe(conversations: Sequence[Conversation]) -> dict[str, int]:
    """Counts for the report: conversations, requests, groups, fixed (non-history) prompt tokens."""
    return {
        "conversations": len(conversations),
        "requests": sum(len(c.turns) for c in conversations),
        "groups": len({c.group for c in conversations}),
        "new_prompt_tokens": sum(len(t.new_ids) for c in conversations for t in c.turns),
        "max_output_tokens": sum(t.output_len for c in conversations for t in c.turns),
    }
