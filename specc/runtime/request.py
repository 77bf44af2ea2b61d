"""Requests and their outputs: per-request sampling parameters, stop conditions and counters."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

from specc.errors import PromptError


@dataclass(frozen=True)
class SamplingParams:
    """Per-request decoding parameters (OpenAI/vLLM conventions).

    Attributes:
        max_new_tokens: generated tokens at most (>= 1), the EOS token included if emitted.
        temperature: >= 0; 0 = greedy (argmax).
        top_p: in (0, 1]; 1 = off.
        top_k: >= 0; 0 = off.
        seed: per-request seed (reproducible sampling whatever the batch), or None (the runtime's
            generator, seeded from its base seed and the request index).
        stop: stop strings; generation ends once the decoded output contains one (the text is cut
            before it, the tokens up to and including the one completing it are kept).
        ignore_eos: keep generating past the model's EOS tokens.
    """

    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: Optional[int] = None
    stop: Tuple[str, ...] = ()
    ignore_eos: bool = False

    def validate(self, where: str = "request") -> None:
        """Raise PromptError naming the bad field."""
        if int(self.max_new_tokens) < 1:
            raise PromptError(f"{where}: max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.temperature >= 0:
            raise PromptError(f"{where}: temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise PromptError(f"{where}: top_p must lie in (0, 1], got {self.top_p}")
        if int(self.top_k) < 0:
            raise PromptError(f"{where}: top_k must be >= 0 (0 = off), got {self.top_k}")
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise PromptError(f"{where}: stop strings must be non-empty strings, got {list(self.stop)!r}")


@dataclass
class Request:
    """One prompt to continue. ``prompt_ids`` are token ids (chat template already applied).
    ``adapter``: the LoRA adapter the target applies to this request's rows (None: the base model;
    :mod:`specc.runtime.lora`)."""

    prompt_ids: List[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    prompt: str = ""
    request_id: str = ""
    adapter: Optional[str] = None


@dataclass
class RequestCounters:
    """Speculation counters of one request (vLLM's names; `vllm/v1/spec_decode/metrics.py`).

    num_drafts: verify steps in which this request had >= 1 draft token.
    num_draft_tokens: draft tokens proposed (after clipping).
    num_accepted_tokens: draft tokens accepted.
    num_accepted_tokens_per_pos: accepted count at each draft position: one entry per position
        (length κ, zeros included, like vLLM's counter) when built by :meth:`for_steps`.
    num_steps: decode (verify) steps the request took part in; τ = emitted / num_steps.
    num_emitted: tokens emitted by those steps (accepted + bonus; before EOS/stop truncation).
    num_draft_tokens_per_pos: verify steps that verified a draft at each draft position (a lookup
        drafter may propose fewer than κ, or none): with ``num_steps``, the draft tokens a step
        verifies at a smaller κ (``specc tune``'s cost of a lookup drafter). No vLLM counterpart.
    """

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    num_accepted_tokens_per_pos: List[int] = field(default_factory=list)
    num_steps: int = 0
    num_emitted: int = 0
    num_draft_tokens_per_pos: List[int] = field(default_factory=list)

    @classmethod
    def for_steps(cls, num_steps: int) -> "RequestCounters":
        """Zeroed counters for a runtime whose deepest state drafts ``num_steps`` (κ) tokens:
        ``num_accepted_tokens_per_pos`` and ``num_draft_tokens_per_pos`` are ``[0] * κ``."""
        return cls(num_accepted_tokens_per_pos=[0] * int(num_steps), num_draft_tokens_per_pos=[0] * int(num_steps))

    def observe(self, num_draft: int, num_accepted: int) -> None:
        """Record one verify step with ``num_draft`` valid drafts of which ``num_accepted`` passed."""
        self.num_steps += 1
        self.num_emitted += num_accepted + 1
        if num_draft > 0:
            self.num_drafts += 1
            self.num_draft_tokens += num_draft
            self.num_accepted_tokens += num_accepted
            if len(self.num_accepted_tokens_per_pos) < num_accepted:
                self.num_accepted_tokens_per_pos.extend([0] * (num_accepted - len(self.num_accepted_tokens_per_pos)))
            for i in range(num_accepted):
                self.num_accepted_tokens_per_pos[i] += 1
            if len(self.num_draft_tokens_per_pos) < num_draft:
                self.num_draft_tokens_per_pos.extend([0] * (num_draft - len(self.num_draft_tokens_per_pos)))
            for i in range(num_draft):
                self.num_draft_tokens_per_pos[i] += 1

    @property
    def tau(self) -> float:
        """Mean tokens per verify step, bonus included (Spec-Bench's τ); 1.0 for plain decode."""
        return self.num_emitted / self.num_steps if self.num_steps else 0.0

    def as_dict(self) -> Dict[str, object]:
        return {
            "num_drafts": self.num_drafts, "num_draft_tokens": self.num_draft_tokens,
            "num_accepted_tokens": self.num_accepted_tokens,
            "num_accepted_tokens_per_pos": list(self.num_accepted_tokens_per_pos),
            "num_draft_tokens_per_pos": list(self.num_draft_tokens_per_pos),
            "num_steps": self.num_steps, "tau": round(self.tau, 4),
        }


@dataclass
class RequestOutput:
    """A finished request.

    token_ids: generated ids (EOS included when it ended the request; stop-string tokens kept).
    text: decoded output, EOS dropped and cut before a stop string.
    finish_reason: ``"eos"``, ``"stop"``, ``"length"`` (max_new_tokens) or ``"max_model_len"``;
        with the incremental API also ``"abort"`` (cancelled), ``"error"`` (an internal failure of this
        request alone, described by ``error``) and ``"prefilled"`` (a disaggregated prefill's export).
    time_s: seconds from admission to finish; ttft_s: seconds from admission to the first token
        (prefill included). Time per output token = (time_s - ttft_s) / (len(token_ids) - 1).
    """

    request: Request
    token_ids: List[int]
    text: str
    finish_reason: str
    counters: RequestCounters
    time_s: float = 0.0
    ttft_s: float = 0.0
    error: str = ""

    @property
    def tpot_s(self) -> float:
        """Mean seconds per output token after the first (0 for one-token outputs)."""
        n = len(self.token_ids)
        return (self.time_s - self.ttft_s) / (n - 1) if n > 1 else 0.0


def check_prompts(requests: Sequence[Request], max_model_len: int, vocab_size: int) -> None:
    """Raise PromptError for an empty prompt, one with no room to generate, or bad token ids."""
    for i, r in enumerate(requests):
        where = f"prompt {r.request_id or i}"
        r.params.validate(where)
        if len(r.prompt_ids) == 0:
            raise PromptError(f"{where}: the prompt has no tokens; give at least one token of text")
        if len(r.prompt_ids) >= max_model_len:
            raise PromptError(
                f"{where}: {len(r.prompt_ids)} prompt tokens leave no room to generate within "
                f"max_model_len={max_model_len}; shorten the prompt or raise target.max_model_len")
        bad = [t for t in r.prompt_ids if not 0 <= int(t) < vocab_size]
        if bad:
            raise PromptError(f"{where}: token ids {bad[:5]} are outside the vocabulary [0, {vocab_size})")
