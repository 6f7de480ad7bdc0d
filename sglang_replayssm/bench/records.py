"""One request's outcome as the client saw it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class RequestRecord:
    rid: str  # f"{conversation}.{turn}", equal across arms for the same request
    conversation: int
    turn: int
    group: int
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    max_new_tokens: int = 0
    start_s: float = 0.0  # send time, relative to the run's start
    ttft_s: float | None = None  # first chunk carrying output tokens
    e2e_s: float | None = None
    output_ids: list[int] = field(default_factory=list)
    # speculative decoding (SGLang's meta_info; 0 without it): verify forwards, accepted draft tokens
    spec_verify_ct: int = 0
    spec_correct_drafts: int = 0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RequestRecord:
        return cls(**data)


def match_depth(ref_cached: int, arm_cached: int) -> str:
    """How deep an arm matched a request against a reference arm: ``"same"``, ``"deeper"`` or ``"shallower"``."""
    return "same" if arm_cached == ref_cached else "deeper" if arm_cached > ref_cached else "shallower"
