"""Grammar-constrained decoding: the token-level counterpart of ``action_masks()``.

While the policy writes a call, its next-token logits can be masked to the legal-call grammar:
the first token is one of ``read`` / ``test`` / ``edit`` / ``revert`` / ``submit``, after
``edit`` one of the five ops, then ``<eoc>``. :class:`CallGrammar` is that grammar as a trie
over token ids with integer states; the sampler records, for every policy position, the state it
sampled under, and the trainer applies the same mask when it scores the batch (see
:func:`mask_logits`), so log-probs, entropy and the PPO ratio are those of the masked
distribution that actually produced the tokens.

The grammar is the *syntax* of a call only: ``revert`` before any change is still written (and
answered by the env as an invalid call), since legality that depends on the episode is the env's
``call_mask``, not a property of token prefixes.
"""

from __future__ import annotations

from typing import Sequence

import torch

from bugfix_gym import CALLS, Tokenizer

MASKED_LOGIT = -1e9  # finite: exp() is exactly 0 in float32, and 0 * logp stays 0 in the entropy (no NaN)
NO_STATE = -1  # a position sampled without the grammar (or not a policy position)


class CallGrammar:
    """The legal calls as a trie over token ids, each call ending in ``<eoc>``.

    State ``start`` (0) is the beginning of a call; ``allowed[s]`` is the set of tokens that keep
    the call a prefix of a legal one; ``step(s, t)`` follows token ``t``. The state reached by
    ``<eoc>`` is final (nothing allowed): the call is over, and the next call starts at ``start``.

    :param tokenizer: gives the token ids of the calls and ``<eoc>``
    :param calls: the legal calls as text (default: the nine of ``bugfix_gym.CALLS``)
    """

    def __init__(self, tokenizer: Tokenizer, calls: Sequence[str] = CALLS):
        if not calls:
            raise ValueError("a call grammar needs at least one call")
        children: list[dict[int, int]] = [{}]
        final: list[bool] = [False]
        for call in calls:
            ids = tokenizer.encode(call)
            if not ids or tokenizer.unk_id in ids:
                raise ValueError(f"call {call!r} is not made of tokenizer words; use a tokenizer that knows it")
            state = 0
            for t in ids + [tokenizer.eoc_id]:
                nxt = children[state].get(t)
                if nxt is None:
                    children.append({})
                    final.append(False)
                    nxt = children[state][t] = len(children) - 1
                state = nxt
            final[state] = True
        self.calls = tuple(calls)
        self.start = 0
        self.n_states = len(children)
        self.vocab_size = tokenizer.vocab_size
        self.allowed = torch.zeros(self.n_states, self.vocab_size, dtype=torch.bool)  # [S, V]
        self.next_state = torch.full((self.n_states, self.vocab_size), NO_STATE, dtype=torch.long)  # [S, V]
        for s, kids in enumerate(children):
            for t, nxt in kids.items():
                self.allowed[s, t] = True
                self.next_state[s, t] = nxt
        self.final = torch.tensor(final, dtype=torch.bool)  # [S]

    def step(self, state: int, token: int) -> int:
        """The state after ``token``; raises ``ValueError`` if ``token`` is not allowed in ``state``."""
        nxt = int(self.next_state[state, token])
        if nxt == NO_STATE:
            raise ValueError(f"token {token} is not allowed in grammar state {state}")
        return nxt

    def is_final(self, state: int) -> bool:
        """True once a whole call (``<eoc>`` included) has been written."""
        return bool(self.final[state])

    def __repr__(self) -> str:
        return f"CallGrammar(calls={len(self.calls)}, states={self.n_states}, vocab_size={self.vocab_size})"


def mask_logits(logits: torch.Tensor, states: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Mask ``logits`` to the grammar where a state is given.

    :param logits: [..., V] next-token logits
    :param states: [...] long grammar state of each position (``NO_STATE`` = leave unmasked)
    :param allowed: [S, V] bool, :attr:`CallGrammar.allowed`
    :return: logits [..., V] with disallowed tokens set to :data:`MASKED_LOGIT`
    """
    constrained = states >= 0  # [...]
    keep = allowed.to(logits.device)[states.clamp(min=0)] | ~constrained[..., None]  # [..., V]
    return logits.masked_fill(~keep, MASKED_LOGIT)
