"""A saved TinyAgent that answers a BugFix transcript with its next call: what ``bugfix-gym serve``
samples for each chat request (agents/cli/serve.py; the chat <-> transcript mapping is
:mod:`bugfix_gym.integrations.chat`).

The transcript is encoded as the episode sampler encodes an episode (``encode_segment`` per segment,
owner codes from who wrote it, tool outputs cut to fit the context as the sampler cuts them) and the
call is written by the one decoder, :func:`agents.decoding.decoder.write_calls`, with the policy's
grammar and foresight, as ``predict`` writes it.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import torch

from bugfix_gym.contract.tokens import OWNER_TOOL, encode_segment

from agents.decoding.decoder import write_calls
from agents.model.threads import use_threads
from agents.rollout.sampler import cut_tool_output

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm


class ContextFull(ValueError):
    """The transcript leaves no room for one more call in the model's context (one line: start over)."""


@dataclass
class WrittenCall:
    """One sampled call: its text (as the env reads it), token ids, their words and log-probs, and
    whether it ended with ``<eoc>`` (else it stopped at its token limit)."""

    text: str
    tokens: list[int]
    words: list[str]
    logp: list[float]
    ended: bool


class ChatAgent:
    """Writes the next call of a BugFix transcript with a saved model's policy; thread-safe (one call at a time).

    :param model: the loaded algorithm (``agents.algorithms.presets.load_algorithm``); its policy's
        ``grammar`` and ``foresight`` decide the decoding
    """

    def __init__(self, model: TokenOnPolicyAlgorithm):
        self.policy = model.policy
        self.tok = self.policy.tokenizer
        self.max_len = self.policy.model.config.max_len  # a TinyAgent or an HF model (agents.model.hf_adapter)
        self.max_call_tokens = self.policy.max_call_tokens
        self._lock = threading.Lock()

    def encode(self, segments: Sequence[tuple[int, str]]) -> list[int]:
        """The transcript's token ids, as the episode sampler builds them; :class:`ContextFull` when the
        prompt, or a tool output, leaves no room for the next call.

        :param segments: ``(owner, text)`` segments, the prompt first (``transcript_of``)
        """
        ids: list[int] = []
        for owner, text in segments:
            seg = encode_segment(self.tok, owner, text)
            if owner == OWNER_TOOL:
                room = self.max_len - len(ids) - self.max_call_tokens
                if room <= 0:
                    raise ContextFull(self._full(len(ids)))
                seg = cut_tool_output(seg, room)
            ids += seg
        if len(ids) + self.max_call_tokens > self.max_len:
            raise ContextFull(self._full(len(ids)))
        return ids

    def _full(self, n_tokens: int) -> str:
        return (f"the conversation is {n_tokens} tokens and one call needs up to {self.max_call_tokens} more, beyond "
                f"the model's context of {self.max_len} tokens: start a new episode (a shorter chat)")

    def write(self, ids: list[int], n: int = 1, temperature: float = 1.0, seed: int | None = None,
              max_tokens: int | None = None, open_calls: Sequence[bool] | None = None) -> list[WrittenCall]:
        """``n`` calls sampled after ``ids`` (one batch of ``n`` rows of the decoder).

        :param ids: the transcript's tokens (:meth:`encode`)
        :param n: how many calls
        :param temperature: sampling temperature; 0: greedy (``predict(deterministic=True)``)
        :param seed: seeds the sampling (None: the global RNG)
        :param max_tokens: the most tokens a call may have, ``<eoc>`` included (at most the policy's own limit)
        :param open_calls: with a grammar, the calls the env's call mask leaves open (bool per grammar call)
        """
        grammar = self.policy.grammar
        start = None if grammar is None or open_calls is None else [grammar.start_for(open_calls)] * n
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        limit = self.max_call_tokens if max_tokens is None else min(int(max_tokens), self.max_call_tokens)
        model = self.policy.model
        with self._lock, use_threads(self.policy.torch_threads, self.policy.device), torch.no_grad():
            was_training = model.training
            model.eval()
            try:
                calls = write_calls(model, model.new_cache(n), [list(ids)] * n, [True] * n, self.tok.eoc_id,
                                    max_call_tokens=limit, grammar=grammar, temperature=temperature or 1.0,
                                    deterministic=temperature == 0, generator=generator, start_states=start,
                                    foresight=self.policy.foresight)
            finally:
                model.train(was_training)
        eoc = self.tok.eoc_id
        return [WrittenCall(self.tok.decode(t), list(t), [self._token_text(i) for i in t], list(lp),
                            bool(t) and t[-1] == eoc) for t, lp in zip(calls.tokens, calls.logp)]

    def _token_text(self, token: int) -> str:
        """One token as text, for the response's log-probs, its end-of-turn token included (``<eoc>``,
        ``<|im_end|>``, which a plain ``decode`` stops before)."""
        return self.tok.decode([token], stop_at_eoc=False)
