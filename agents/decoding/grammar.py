"""Grammar-constrained decoding: the token-level counterpart of the env's call mask.

While the policy writes a call, :class:`CallGrammar` says which tokens may come next so
that every call it can write is one of a fixed list of legal calls (for BugFix-v0 the nine
calls of ``bugfix_gym.CALLS``). The legal calls are stored as a trie over token ids; each
trie node is an integer *state*, and ``allowed[state]`` is the boolean row of tokens that
may follow. The sampler masks the logits with that row before sampling and records the
state of every policy token; the trainer applies the same rows when it scores the episode,
so log-probabilities, entropies and PPO ratios are those of the masked distribution that
actually produced the tokens.

A call may also start from a *call mask* (:meth:`CallGrammar.start_for`): the env's bool row
over the legal calls saying which of them are open this turn (BugFix-v0's ``info["call_mask"]``
or ``info["useful_calls"]``). The state then carries the closed calls as bits, so the tokens
that lead only to closed calls are masked too, and the recorded states still say exactly which
rows were used.
"""

from __future__ import annotations

from typing import Sequence

import torch

from bugfix_gym.contract.tokens import TokenizerLike

NO_STATE = -1  # positions written without a grammar (or not written by the policy)


class CallGrammar:
    """The legal calls as a trie of token ids: ``allowed[state]`` and ``step(state, token)``.

    State 0 is the start of a call. Writing a call's last word leads to a state where only
    ``<eoc>`` is allowed; ``<eoc>`` ends the call. A state is ``node + n_nodes * closed``, where
    ``node`` is the trie node and ``closed`` the bits of the calls closed by a call mask (0: none,
    so states below ``n_nodes`` are those of the plain grammar).

    :param tokenizer: the policy's tokenizer (any :class:`bugfix_gym.contract.tokens.TokenizerLike`: the trie is
        over its ``encode`` of each call, and ``eoc_id`` ends a call)
    :param calls: the legal calls as text (e.g. ``bugfix_gym.CALLS``)
    """

    start = 0

    def __init__(self, tokenizer: TokenizerLike, calls: Sequence[str]):
        if not calls:
            raise ValueError("CallGrammar needs at least one legal call")
        self.calls = tuple(calls)
        self.eoc_id = tokenizer.eoc_id
        children: list[dict[int, int]] = [{}]
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
        self._next = children
        # _via[node][t]: the bits of the calls whose path goes from node through token t;
        # _ending[node]: the bits of the calls that end at node (so <eoc> may follow)
        self._via: list[dict[int, int]] = [dict.fromkeys(nxt, 0) for nxt in children]
        self._ending = [0] * len(children)
        for k, call in enumerate(self.calls):
            node = 0
            for token in tokenizer.encode(call):
                self._via[node][token] |= 1 << k
                node = children[node][token]
            self._ending[node] |= 1 << k
        through = torch.zeros(len(children), tokenizer.vocab_size, dtype=torch.long)  # [n_nodes, V]
        for node, via in enumerate(self._via):
            through[node, list(via)] = torch.tensor(list(via.values()), dtype=torch.long)
        self._through = through
        self._ends_here = torch.tensor(self._ending, dtype=torch.long)  # [n_nodes]
        self.allowed = self._closed_rows(torch.arange(len(children)))  # [n_nodes, V] the plain grammar's rows
        self._forced: dict[int, int | None] = {}  # state -> its one allowed token (None: a choice), filled lazily

    @property
    def n_nodes(self) -> int:
        """The trie's nodes: the states of the plain grammar (no call closed)."""
        return len(self._next)

    def start_for(self, open_calls: Sequence[bool] | None) -> int:
        """The start state of a call when only the calls with ``open_calls[k]`` True may be written
        (``open_calls`` lists ``self.calls`` in order; None: all of them)."""
        if open_calls is None:
            return self.start
        if len(open_calls) != len(self.calls):
            raise ValueError(f"a call mask of {len(open_calls)} entries for a grammar of {len(self.calls)} calls; "
                             "the mask must list the grammar's calls in order")
        closed = sum(1 << k for k, ok in enumerate(open_calls) if not ok)
        if closed == (1 << len(self.calls)) - 1:
            return self.start  # nothing open: the mask cannot be followed, write any legal call
        return self.start + self.n_nodes * closed

    def _rows(self, states: torch.Tensor) -> torch.Tensor:
        """bool [N, V]: the tokens allowed in each state of ``states`` [N] (all >= 0)."""
        if bool((states < self.n_nodes).all()):
            return self.allowed.to(states.device)[states]  # no call closed: the plain rows
        return self._closed_rows(states)

    def _closed_rows(self, states: torch.Tensor) -> torch.Tensor:
        """``_rows`` worked out from the call bits of each state's node and its closed calls."""
        node, closed = states % self.n_nodes, states // self.n_nodes  # [N], [N]
        open_bits = ~closed[:, None]  # [N, 1]
        rows = (self._through.to(states.device)[node] & open_bits) != 0  # [N, V]
        rows[:, self.eoc_id] = (self._ends_here.to(states.device)[node] & open_bits[:, 0]) != 0
        return rows

    def node(self, state: int) -> int:
        """The trie node of ``state`` (>= 0), without the calls it has closed."""
        return state % self.n_nodes

    def close(self, state: int, calls: Sequence[int]) -> int:
        """``state`` (>= 0) with the calls at indices ``calls`` closed too."""
        closed = state // self.n_nodes
        for k in calls:
            closed |= 1 << k
        return self.node(state) + self.n_nodes * closed

    def is_open(self, state: int, call: int) -> bool:
        """Whether the call at index ``call`` is open in ``state`` (>= 0)."""
        return not (state // self.n_nodes) >> call & 1

    def step(self, state: int, token: int) -> int:
        """The state after writing ``token`` in ``state`` (after ``<eoc>`` the call is over: the start
        state, with the same calls closed).

        :raises ValueError: ``token`` is not allowed in ``state``
        """
        node, closed = state % self.n_nodes, state // self.n_nodes
        bits = self._ending[node] if token == self.eoc_id else self._via[node].get(token, 0)
        if state < 0 or not bits & ~closed:  # plain ints: this runs once per sampled token
            raise ValueError(f"token {token} is not allowed in grammar state {state}")
        if token == self.eoc_id:
            return self.start + self.n_nodes * closed
        return self._next[node][token] + self.n_nodes * closed

    def forced(self, state: int) -> int | None:
        """The one token allowed in ``state``, or None when there is a choice (or no grammar state, ``-1``).
        A forced token has probability 1 under the masked policy: its log-prob is 0 and no draw decides it."""
        if state < 0:
            return None
        if state not in self._forced:
            allowed = self._rows(torch.tensor([state]))[0].nonzero().flatten().tolist()
            self._forced[state] = allowed[0] if len(allowed) == 1 else None
        return self._forced[state]

    def mask_logits(self, logits: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``logits`` [N, V] with the tokens not allowed in ``states`` [N] set to ``-inf``.

        Rows whose state is :data:`NO_STATE` are left unchanged.
        """
        free = states < 0  # [N]
        allowed = self._rows(states.clamp(min=0)) | free[:, None]  # [N, V]
        return logits.masked_fill(~allowed, float("-inf"))
