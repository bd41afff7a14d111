"""The call decoder: :func:`write_calls` writes one call per row of a batch token by token with the
KV cache (sampled at a temperature, or greedy), optionally constrained to the legal-call grammar and
to what :class:`~agents.decoding.foresight.Foresight` leaves open. The episode sampler and
``TinyAgentPolicy.predict`` both use it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from agents.decoding.foresight import Foresight
from agents.decoding.grammar import NO_STATE, CallGrammar
from agents.model.tinyagent import KVCache, TinyAgent


@dataclass
class WrittenCalls:
    """What :func:`write_calls` wrote: per row the call's tokens, their log-probs and grammar states,
    the critic value of every token fed to the model (in feeding order), and the tokens not fed
    (the rest of the row's ``feed`` and its written tokens, in order, that no model call needed)."""

    tokens: list[list[int]]
    logp: list[list[float]]
    states: list[list[int]]
    fed_values: list[list[float]]
    unfed: list[list[int]]

    @classmethod
    def empty(cls, n_rows: int) -> "WrittenCalls":
        def rows() -> list:
            return [[] for _ in range(n_rows)]

        return cls(rows(), rows(), rows(), rows(), rows())

    def add(self, row: int, token: int, logp: float, state: int) -> None:
        """Row ``row`` wrote ``token`` (log-prob ``logp``) in grammar state ``state``."""
        self.tokens[row].append(token)
        self.logp[row].append(logp)
        self.states[row].append(state)


#: the most tokens one call may have when nobody says otherwise: the default of the algorithms' setting
#: ``max_call_tokens`` (agents/algorithms/config.py reads it from here, the lowest layer that uses it)
DEFAULT_MAX_CALL_TOKENS = 8


@torch.no_grad()
def write_calls(model: TinyAgent, cache: KVCache, feed: list[list[int]], writing: Sequence[bool], eoc_id: int, *,
                max_call_tokens: int, grammar: CallGrammar | None = None, temperature: float = 1.0,
                deterministic: bool = False, generator: torch.Generator | None = None,
                start_states: Sequence[int] | None = None, foresight: Foresight | None = None) -> WrittenCalls:
    """Write one call for each row with ``writing[b]``, token by token with the KV cache.

    Each step every row still writing writes one token. A model call feeds each row its pending
    tokens (first ``feed[b]``: the prompt, or a finished call's last token and the tool output; then
    the tokens it wrote since) and gives the logits of the rows that choose. A token the grammar
    forces (the only one allowed, e.g. ``<eoc>`` after a call's last word) is written without the
    model, with log-prob 0, and a step in which every row is forced makes no model call: its
    pending tokens wait for the next call, or stay unfed (``unfed``) for the caller to feed later.
    Every step draws one uniform number per writing row, forced or not, so the random numbers a
    row's choices use are the same as when each token had its own model call. A call ends at
    ``<eoc>`` or after ``max_call_tokens`` tokens; its last token is never fed here.

    :param model: the policy (eval mode, no grad)
    :param cache: the rows' KV cache; ``feed`` continues each row where the cache ends
    :param feed: per row, tokens to feed before writing (may be empty)
    :param writing: per row, whether it writes a call now (a row with nothing to feed cannot)
    :param eoc_id: the end-of-call token
    :param max_call_tokens: the most tokens one call may have (``<eoc>`` included)
    :param grammar: mask the logits to the legal calls (None: any token)
    :param temperature: sampling temperature; ``logp`` is the log-prob under the sampled distribution
    :param deterministic: greedy decoding instead of sampling
    :param generator: seeds the sampling
    :param start_states: per row, the grammar state its call starts in (default: the grammar's start;
        :meth:`agents.decoding.grammar.CallGrammar.start_for` makes the state of a call mask)
    :param foresight: with a grammar, close the edit ops the model expects to answer ``no change``
        (:class:`Foresight`) before it picks one
    """
    B = len(feed)
    out = WrittenCalls.empty(B)
    state = [NO_STATE] * B if grammar is None else list(start_states or [grammar.start] * B)
    active = [b for b in range(B) if writing[b] and feed[b]]
    pending = [list(f) for f in feed]
    while active:
        forced = [None if grammar is None else grammar.forced(state[b]) for b in active]
        choosing = [b for b, f in zip(active, forced) if f is None]
        uniform = None if deterministic else torch.rand(len(active), 1, generator=generator, dtype=torch.float64)
        if choosing:
            logits = _feed(model, cache, pending, out)
            pending = [[] for _ in range(B)]
            picks = [k for k, f in enumerate(forced) if f is None]
            chosen = iter(zip(*_next_tokens(model, cache, logits, choosing, state, grammar=grammar,
                                            temperature=temperature, uniform=None if uniform is None
                                            else uniform[picks], foresight=foresight)))
        writers, active = active, []
        for b, f in zip(writers, forced):
            t, lp = (f, 0.0) if f is not None else next(chosen)
            out.add(b, t, lp, state[b])
            if grammar is not None:
                state[b] = grammar.step(state[b], t)
            if t != eoc_id and len(out.tokens[b]) < max_call_tokens:
                pending[b].append(t)
                active.append(b)
    out.unfed = _feed_the_idle(model, cache, pending, writing, out)
    return out


def _feed_the_idle(model: TinyAgent, cache: KVCache, pending: list[list[int]], writing: Sequence[bool],
                   out: WrittenCalls) -> list[list[int]]:
    """When no model call was made (no row chose a token), feed the rows that do not write their
    ``feed`` all the same; return what is left unfed per row."""
    if any(pending) and not any(out.fed_values):
        _feed(model, cache, [[] if writing[b] else p for b, p in enumerate(pending)], out)
        return [p if writing[b] else [] for b, p in enumerate(pending)]
    return pending


def _feed(model: TinyAgent, cache: KVCache, pending: list[list[int]], out: WrittenCalls) -> torch.Tensor:
    """Feed each row its pending tokens in one :meth:`TinyAgent.extend`, keep their critic values in
    ``out.fed_values``; return the logits at each row's last fed token [B, V]."""
    device = model.tok_emb.weight.device
    n_new = [len(p) for p in pending]
    S = max(n_new)
    chunk = torch.tensor([p + [0] * (S - len(p)) for p in pending], dtype=torch.long, device=device)  # [B, S]
    logits, values = model.extend(chunk, torch.tensor(n_new, device=device), cache)  # [B, V], [B, S]
    fed = values.cpu().tolist()
    for b in range(len(pending)):
        out.fed_values[b] += fed[b][: n_new[b]]
    return logits


def _next_tokens(model: TinyAgent, cache: KVCache, logits: torch.Tensor, rows: list[int], state: list[int], *,
                 grammar: CallGrammar | None, temperature: float, uniform: torch.Tensor | None,
                 foresight: Foresight | None) -> tuple[list[int], list[float]]:
    """The next token of each of ``rows`` from their logits [B, V] (at ``temperature``, within the grammar
    and what foresight leaves open, which it may close in ``state``, unless it only teaches), and its
    log-prob under the distribution sampled from: drawn with the rows' ``uniform`` numbers [R, 1] in [0, 1),
    or the most likely one when ``uniform`` is None."""
    device = logits.device
    step_logits = logits[torch.tensor(rows, device=device)].float() / temperature  # [R, V]
    sample_state = state
    if foresight is not None and grammar is not None:
        sample_state = list(state) if foresight.teach else state  # teach: the recorded state stays the grammar's
        foresight.refine(model, cache, rows, sample_state)
    if grammar is not None:
        step_logits = grammar.mask_logits(step_logits, torch.tensor([sample_state[b] for b in rows], device=device))
    logp_all = F.log_softmax(step_logits, dim=-1)  # [R, V]
    new = logp_all.argmax(-1, keepdim=True) if uniform is None else sample_tokens(logp_all.exp(), uniform=uniform)
    return new.squeeze(-1).tolist(), logp_all.gather(-1, new).squeeze(-1).tolist()  # [R], [R]


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None,
                  uniform: torch.Tensor | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` [R, V] -> ids [R, 1], by inverting the cumulative distribution
    (cheaper than ``torch.multinomial`` on a CPU). A token of probability zero
    is never drawn.

    :param probs: [R, V] probabilities (each row's total need not be exactly 1)
    :param generator: seeds the draws
    :param uniform: [R, 1] float64 numbers in [0, 1) to use instead of drawing them
    """
    cdf = probs.double().cumsum(-1)  # [R, V]
    if uniform is None:
        uniform = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64)  # [R, 1]
    u = uniform * cdf[:, -1:]  # [R, 1] in [0, total)
    new = torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[1] - 1)  # first i with cdf[i] > u
    zero = probs.gather(-1, new) == 0  # only if rounding put u at the very top
    return torch.where(zero, probs.argmax(-1, keepdim=True), new)
