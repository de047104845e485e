"""The parameter sets of the synthetic multi-turn traces (:mod:`.synthetic_trace`), and where
their numbers come from.

A parameter set is a :class:`TraceParams`; :data:`PRESETS` names the shipped ones. The figures
each is calibrated to, and how sure we are of them:

``sharegpt`` -- chat as in ShareGPT (conversations shared from ChatGPT, 2023):

* 73% of conversations are multi-turn: CachedAttention (Gao et al., "Cost-Efficient Large
  Language Model Serving for Multi-turn Conversations with CachedAttention", USENIX ATC'24,
  section 2), from its analysis of ShareGPT.
* 3.51 turns per conversation on average (94,145 conversations, 330,239 turns): the dataset
  table of LMSYS-Chat-1M (Zheng et al., ICLR'24, Table 1), repeated in ShareChat (Yan et al.,
  arXiv 2512.17843, Table 1). The two figures fix the multi-turn conversations' mean at
  (3.51 - 0.27) / 0.73 = 4.44 turns; the shape of that tail (geometric here) is our choice,
  not a published fit.
* about 94 tokens per user prompt and 348 per answer: the same LMSYS-Chat-1M table, as we
  remember it (we could not re-check the per-turn token columns; treat them as approximate).
  Spreads (lognormal, sigma 1.0 and 0.7) are ours.
* no published figure for ShareGPT's system prompts, think times or arrival rate (the dataset
  has no timestamps and no system prompts): a serving deployment prepends a system prompt, so
  we give every conversation one of 8 shared ones (about 1,000 tokens, popularity Zipf 1.0);
  a user reads and types for a lognormal think time of median 30 s; new conversations arrive
  as a Poisson process whose rate is set so that, at 512 tokens per block, tens of thousands
  of blocks are live at once (the CPU-tier sizes kv-offload is measured at).

``chat-short`` -- shorter chat as in LMSYS-Chat-1M (Chatbot Arena and the Vicuna demo):

* 2.0 turns per conversation, about 69.5 tokens per user prompt and 214.5 per answer: the
  LMSYS-Chat-1M table above (token figures remembered, as for ShareGPT). The share of
  multi-turn conversations is not published there; a geometric number of turns with mean 2.0
  makes it 50%, our assumption. System prompts, think times and rate: ours, as above (a
  shorter system prompt, 600 tokens).

``agent`` -- long tool-use sessions (a coding agent calling tools): no published
distribution we could verify, so every number is ours and illustrative: at least 5 and on
average 30 turns; each turn adds a tool result (lognormal mean 700 tokens) and a short model
action (mean 150 tokens); one of 4 large shared system prompts (tool definitions, about
6,000 tokens); think time is the tool's run time (median 2 s). Qualitatively it follows the
agent traces the literature describes (long sessions whose context grows by tool output:
SWE-agent trajectories as used in LMCache's eviction study, KVFlow's agent workflows) but it
is not fitted to them.

Time per answer is ``output_tokens / decode_tokens_per_s`` in every set (30 tokens/s, ours):
the next turn of a conversation arrives after the answer is written and the think time.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .errors import ConfigError

__all__ = ["PRESETS", "TraceParams", "preset"]


@dataclass(frozen=True)
class TraceParams:
    """A synthetic multi-turn trace's parameters (tokens, seconds, conversations per second).

    Turns: a conversation has one turn with probability ``1 - multi_turn_share``, else
    ``min_multi_turns`` plus a geometric number (mean ``multi_turn_mean - min_multi_turns``),
    at most ``max_turns``. A turn adds the user's question (``question_tokens``) to the
    conversation; its answer (``answer_tokens``) is part of the next turn's prompt. Lengths
    are lognormal with the given mean and ``*_sigma`` (of the log). A conversation stops
    early when the next prompt would exceed ``max_context_tokens``.
    """

    name: str
    description: str
    multi_turn_share: float
    multi_turn_mean: float
    min_multi_turns: int
    max_turns: int
    question_tokens: float
    question_sigma: float
    answer_tokens: float
    answer_sigma: float
    system_prompts: int
    system_tokens: float
    system_sigma: float
    system_zipf: float
    think_median_s: float
    think_sigma: float
    decode_tokens_per_s: float
    conversations_per_s: float
    max_context_tokens: int

    def __post_init__(self) -> None:
        if not 0.0 <= self.multi_turn_share <= 1.0:
            raise ConfigError(
                f"trace preset {self.name!r}: multi_turn_share must be in [0, 1], "
                f"got {self.multi_turn_share}"
            )
        if not 2 <= self.min_multi_turns <= self.multi_turn_mean <= self.max_turns:
            raise ConfigError(
                f"trace preset {self.name!r}: needs 2 <= min_multi_turns <= multi_turn_mean "
                f"<= max_turns, got {self.min_multi_turns}, {self.multi_turn_mean}, "
                f"{self.max_turns}"
            )
        positive = {
            "question_tokens": self.question_tokens,
            "answer_tokens": self.answer_tokens,
            "system_tokens": self.system_tokens,
            "think_median_s": self.think_median_s,
            "decode_tokens_per_s": self.decode_tokens_per_s,
            "conversations_per_s": self.conversations_per_s,
            "max_context_tokens": self.max_context_tokens,
            "system_prompts": self.system_prompts,
        }
        for key, value in positive.items():
            if not value > 0:
                raise ConfigError(f"trace preset {self.name!r}: {key} must be > 0, got {value}")
        spreads = {
            "question_sigma": self.question_sigma,
            "answer_sigma": self.answer_sigma,
            "system_sigma": self.system_sigma,
            "think_sigma": self.think_sigma,
            "system_zipf": self.system_zipf,
        }
        for key, value in spreads.items():
            if not value >= 0:
                raise ConfigError(f"trace preset {self.name!r}: {key} must be >= 0, got {value}")

    @property
    def mean_turns(self) -> float:
        """The expected turns per conversation, before ``max_turns`` and the context cap."""
        return 1.0 - self.multi_turn_share + self.multi_turn_share * self.multi_turn_mean


_SHAREGPT = TraceParams(
    name="sharegpt",
    description="ShareGPT-like chat: 73% multi-turn, 3.51 turns per conversation",
    multi_turn_share=0.73,
    multi_turn_mean=(3.51 - 0.27) / 0.73,
    min_multi_turns=2,
    max_turns=200,
    question_tokens=94.0,
    question_sigma=1.0,
    answer_tokens=348.0,
    answer_sigma=0.7,
    system_prompts=8,
    system_tokens=1000.0,
    system_sigma=0.3,
    system_zipf=1.0,
    think_median_s=30.0,
    think_sigma=1.0,
    decode_tokens_per_s=30.0,
    conversations_per_s=100.0,
    max_context_tokens=32768,
)

PRESETS: dict[str, TraceParams] = {
    p.name: p
    for p in (
        _SHAREGPT,
        # The same chat, shorter: ShareGPT's spreads, decode speed and context cap.
        replace(
            _SHAREGPT,
            name="chat-short",
            description="LMSYS-Chat-1M-like chat: 2.0 turns per conversation, short answers",
            multi_turn_share=0.5,
            multi_turn_mean=3.0,
            max_turns=100,
            question_tokens=69.5,
            answer_tokens=214.5,
            system_prompts=4,
            system_tokens=600.0,
            think_median_s=20.0,
            conversations_per_s=150.0,
        ),
        TraceParams(
            name="agent",
            description="tool-use agent sessions: 30 turns on average, growing by tool output",
            multi_turn_share=1.0,
            multi_turn_mean=30.0,
            min_multi_turns=5,
            max_turns=300,
            question_tokens=700.0,
            question_sigma=0.8,
            answer_tokens=150.0,
            answer_sigma=0.6,
            system_prompts=4,
            system_tokens=6000.0,
            system_sigma=0.2,
            system_zipf=1.0,
            think_median_s=2.0,
            think_sigma=0.8,
            decode_tokens_per_s=30.0,
            conversations_per_s=4.0,
            max_context_tokens=131072,
        ),
    )
}


def preset(name: str) -> TraceParams:
    """The named parameter set, or a :class:`~kv_offload.errors.ConfigError` listing them."""
    try:
        return PRESETS[name]
    except KeyError:
        raise ConfigError(
            f"unknown trace preset {name!r}; choose one of: {', '.join(PRESETS)}"
        ) from None
