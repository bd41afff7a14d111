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
    and the critic value of every token fed to the model (in feeding order)."""

    tokens: list[list[int]]
    logp: list[list[float]]
    states: list[list[int]]
    fed_values: list[list[float]]

    @classmethod
    def empty(cls, n_rows: int) -> "WrittenCalls":
        return cls([[] for _ in range(n_rows)], [[] for _ in range(n_rows)], [[] for _ in range(n_rows)],
                   [[] for _ in range(n_rows)])

    def add(self, row: int, token: int, logp: float, state: int) -> None:
        """Row ``row`` wrote ``token`` (log-prob ``logp``) in grammar state ``state``."""
        self.tokens[row].append(token)
        self.logp[row].append(logp)
        self.states[row].append(state)


@torch.no_grad()
def write_calls(model: TinyAgent, cache: KVCache, feed: list[list[int]], writing: Sequence[bool], eoc_id: int, *,
                max_call_tokens: int = 8, grammar: CallGrammar | None = None, temperature: float = 1.0,
                deterministic: bool = False, generator: torch.Generator | None = None,
                start_states: Sequence[int] | None = None, foresight: Foresight | None = None) -> WrittenCalls:
    """Write one call for each row with ``writing[b]``, token by token with the KV cache.

    Every model call feeds each row its pending tokens (first ``feed[b]``: the prompt, or a
    finished call's last token and the tool output; then the last sampled token) and samples the
    next token of the rows still writing. A call ends at ``<eoc>`` or after ``max_call_tokens``
    tokens; its last token is *not* fed here (the next turn feeds it with the tool output).

    :param model: the policy (eval mode, no grad)
    :param cache: the rows' KV cache; ``feed`` continues each row where the cache ends
    :param feed: per row, tokens to feed before writing (may be empty)
    :param writing: per row, whether it writes a call now
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
    if grammar is None:
        state = [NO_STATE] * B
    else:
        state = list(start_states) if start_states is not None else [grammar.start] * B
    active = [b for b in range(B) if writing[b]]
    pending = [list(f) for f in feed]
    while any(pending):
        n_new = [len(p) for p in pending]
        logits = _feed(model, cache, pending, out)
        rows = [b for b in active if n_new[b]]  # a writing row always has something to feed
        pending = [[] for _ in range(B)]
        if not rows:
            break
        new, new_logp = _next_tokens(model, cache, logits, rows, state, grammar=grammar, temperature=temperature,
                                     deterministic=deterministic, generator=generator, foresight=foresight)
        active = []
        for b, t, lp in zip(rows, new, new_logp):
            out.add(b, t, lp, state[b])
            if grammar is not None:
                state[b] = grammar.step(state[b], t)
            if t != eoc_id and len(out.tokens[b]) < max_call_tokens:
                pending[b] = [t]
                active.append(b)
    return out


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
                 grammar: CallGrammar | None, temperature: float, deterministic: bool,
                 generator: torch.Generator | None, foresight: Foresight | None) -> tuple[list[int], list[float]]:
    """The next token of each of ``rows`` from their logits [B, V] (at ``temperature``, within the grammar
    and what foresight leaves open, which it may close in ``state``, unless it only teaches), and its
    log-prob under the distribution sampled from."""
    device = logits.device
    step_logits = logits[torch.tensor(rows, device=device)].float() / temperature  # [R, V]
    sample_state = state
    if foresight is not None and grammar is not None:
        sample_state = list(state) if foresight.teach else state  # teach: the recorded state stays the grammar's
        foresight.refine(model, cache, rows, sample_state)
    if grammar is not None:
        step_logits = grammar.mask_logits(step_logits, torch.tensor([sample_state[b] for b in rows], device=device))
    logp_all = F.log_softmax(step_logits, dim=-1)  # [R, V]
    new = logp_all.argmax(-1, keepdim=True) if deterministic else sample_tokens(logp_all.exp(), generator)  # [R, 1]
    return new.squeeze(-1).tolist(), logp_all.gather(-1, new).squeeze(-1).tolist()  # [R], [R]


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` [R, V] -> ids [R, 1], by inverting the cumulative distribution
    (cheaper than ``torch.multinomial`` on a CPU). A token of probability zero
    is never drawn."""
    cdf = probs.double().cumsum(-1)  # [R, V]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]  # [R, 1] in [0, total)
    new = torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[1] - 1)  # first i with cdf[i] > u
    zero = probs.gather(-1, new) == 0  # only if rounding put u at the very top
    return torch.where(zero, probs.argmax(-1, keepdim=True), new)
