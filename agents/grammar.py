"""Grammar-constrained decoding: the token-level counterpart of the env's call mask.

While the policy writes a call, :class:`CallGrammar` says which tokens may come next so
that every call it can write is one of a fixed list of legal calls (for BugFix-v0 the nine
calls of ``bugfix_gym.CALLS``). The legal calls are stored as a trie over token ids; each
trie node is an integer *state*, and ``allowed[state]`` is the boolean row of tokens that
may follow. The sampler masks the logits with that row before sampling and records the
state of every policy token; the trainer applies the same rows when it scores the episode,
so log-probabilities, entropies and PPO ratios are those of the masked distribution that
actually produced the tokens.
"""

from __future__ import annotations

from typing import Sequence

import torch

from bugfix_gym import Tokenizer

NO_STATE = -1  # positions written without a grammar (or not written by the policy)


class CallGrammar:
    """The legal calls as a trie of token ids: ``allowed[state]`` and ``step(state, token)``.

    State 0 is the start of a call. Writing a call's last word leads to a state where only
    ``<eoc>`` is allowed; ``<eoc>`` ends the call.

    :param tokenizer: the policy's tokenizer
    :param calls: the legal calls as text (e.g. ``bugfix_gym.CALLS``)
    """

    start = 0

    def __init__(self, tokenizer: Tokenizer, calls: Sequence[str]):
        if not calls:
            raise ValueError("CallGrammar needs at least one legal call")
        self.calls = tuple(calls)
        self.eoc_id = tokenizer.eoc_id
        children: list[dict[int, int]] = [{}]
        ends: set[int] = set()
        self.max_call_tokens = 0
        for call in self.calls:
            ids = tokenizer.encode(call)
            if not ids or tokenizer.unk_id in ids:
                raise ValueError(f"legal call {call!r} has words the tokenizer does not know; build the tokenizer "
                                 "with them (e.g. from the env's call list)")
            self.max_call_tokens = max(self.max_call_tokens, len(ids) + 1)
            node = 0
            for token in ids:
                if token == self.eoc_id:
                    raise ValueError(f"legal call {call!r} contains the end-of-call token")
                if token not in children[node]:
                    children[node][token] = len(children)
                    children.append({})
                node = children[node][token]
            ends.add(node)
        self._next = children
        allowed = torch.zeros(len(children), tokenizer.vocab_size, dtype=torch.bool)  # [n_states, V]
        for state, nxt in enumerate(children):
            allowed[state, list(nxt)] = True
            if state in ends:
                allowed[state, self.eoc_id] = True
        self.allowed = allowed

    @property
    def n_states(self) -> int:
        return len(self._next)

    def step(self, state: int, token: int) -> int:
        """The state after writing ``token`` in ``state`` (the call is over after ``<eoc>``: ``start``).

        :raises ValueError: ``token`` is not allowed in ``state``
        """
        if token == self.eoc_id and 0 <= state < len(self._next) and bool(self.allowed[state, token]):
            return self.start
        try:
            return self._next[state][token]
        except (IndexError, KeyError):
            raise ValueError(f"token {token} is not allowed in grammar state {state}") from None

    def mask_logits(self, logits: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``logits`` [N, V] with the tokens not allowed in ``states`` [N] set to ``-inf``.

        Rows whose state is :data:`NO_STATE` are left unchanged.
        """
        free = states < 0  # [N]
        allowed = self.allowed.to(logits.device)[states.clamp(min=0)]  # [N, V]
        allowed = allowed | free[:, None]
        return logits.masked_fill(~allowed, float("-inf"))
