"""Grammar-constrained decoding over a list of legal calls that changes every turn (BugFix-v1).

BugFix-v0 has nine fixed calls, so :class:`agents.decoding.grammar.CallGrammar` builds one trie once. BugFix-v1's
legal calls depend on the current source: every sited edit ``edit L.K MUTATION [ARG]`` that applies, ``delete L``
per deletable line, ``revert`` once the source changed (``env.unwrapped.legal_calls()``, about two thousand calls
on a HumanEval function). :class:`LegalCallGrammar` takes that list at the start of each call
(:meth:`LegalCallGrammar.start_for`, fed from ``info["legal_calls"]``, which :class:`LegalCallsInfo` adds) and lets
the policy write, token by token, exactly the calls of the list: at each token only what is still the prefix of a
legal call (or ``<eoc>`` after a whole one) is allowed.

A turn's calls are kept as a *sorted table*: their token ids, one row per call, padded with ``-1`` (which sorts
before every token, so a call sorts before its longer extensions). The calls that share a prefix of length ``d``
are the contiguous rows ``lo:hi``, and column ``d`` of those rows is sorted, so the tokens allowed after the
prefix are that column's distinct values and a token's rows are two binary searches. A grammar *state* is an
integer naming one ``(table, lo, hi, d)``; the states and tables are kept (the oldest tables forgotten past a
memory budget) so that the trainer can mask the logits of the tokens it scores exactly as they were sampled.

The free-text calls (``patch L CODE``, ``insert L CODE``) are not in the list and so cannot be written under this
grammar: TinyAgent repairs with the sited edits and ``delete``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Sequence, cast

import gymnasium as gym
import numpy as np
import torch

from bugfix_gym.contract.tokens import TokenizerLike

from agents.decoding.grammar import NO_STATE, CallGrammar

FALLBACK_CALLS = ("read", "test", "locate", "submit")
"""The calls of the start state :attr:`LegalCallGrammar.start`: legal in every BugFix-v1 state, for a call written
without the env's list (``predict`` on token observations)."""

LEGAL_CALLS_KEY = "legal_calls"
"""The ``info`` key :class:`LegalCallsInfo` fills and the sampler reads (the policy's ``call_mask_key``)."""


class _Table:
    """One turn's legal calls: ``rows`` [n, width] of token ids, sorted, padded with -1.

    :param packed: each call's token ids as the bytes of an array of ``dtype``
    :param lengths: [n] each call's token count
    """

    __slots__ = ("rows", "states")

    def __init__(self, packed: list[bytes], lengths: np.ndarray, dtype: type):
        width = int(lengths.max()) + 1  # a pad column: every call ends in -1
        rows: np.ndarray = np.full((len(packed), width), -1, dtype=dtype)  # [n, width]
        rows[np.arange(width) < lengths[:, None]] = np.frombuffer(b"".join(packed), dtype=dtype)
        # rows in order of their tokens, the first column deciding (as sorting the id tuples does: -1 first)
        self.rows: np.ndarray = rows[np.lexsort(rows.T[::-1])]
        self.states: list[int] = []  # the grammar states of this table (forgotten with it)


class LegalCallGrammar(CallGrammar):
    """The calls legal this turn, as a token-level grammar with :class:`~agents.decoding.grammar.CallGrammar`'s
    interface (``start``, ``start_for``, ``step``, ``forced``, ``mask_logits``) for the decoder, the sampler and the
    trainer. It subclasses ``CallGrammar`` for those three and builds no fixed trie: the call-mask bits
    (``close``, ``is_open``) and foresight, which closes v0's edit ops, do not apply to it.

    :param tokenizer: the policy's tokenizer; it must encode every call without ``<unk>`` (the byte tokenizer
        :class:`bugfix_gym.contract.byte_tokenizer.ByteTokenizer` encodes any text)
    :param max_call_tokens: the most tokens a call may take with its ``<eoc>``: longer legal calls are left out
        of the grammar (the decoder would cut them)
    :param memory_bytes: the tables kept for scoring; past it the oldest are forgotten, and scoring a state of a
        forgotten table is a ``ValueError`` (a batch of 64 twelve-turn episodes keeps about 100 MB)
    """

    def __init__(self, tokenizer: TokenizerLike, max_call_tokens: int, memory_bytes: int = 512 * 2**20):
        self.tokenizer = tokenizer
        self.eoc_id = tokenizer.eoc_id
        self.vocab_size = tokenizer.vocab_size
        self.max_call_tokens = int(max_call_tokens)
        self.memory_bytes = int(memory_bytes)
        self._dtype = np.int16 if self.vocab_size < 2**15 else np.int32
        self._tables: OrderedDict[int, _Table] = OrderedDict()  # table id -> table, oldest first
        self._table_of: dict[str, int] = {}  # a turn's calls, one a line -> their table id
        self._calls_of: dict[int, str] = {}
        self._nodes: dict[int, tuple[int, int, int, int]] = {}  # state -> (table id, lo, hi, depth)
        self._state_of: dict[tuple[int, int, int, int], int] = {}
        self._allowed: dict[int, list[int]] = {}  # state -> its allowed tokens (<eoc> as eoc_id), memoised
        self._encoded: dict[str, bytes] = {}  # a call -> its token ids as the bytes of a _dtype array
        self._bytes = 0
        self._next_table = self._next_state = 0
        self.calls = FALLBACK_CALLS
        self._pinned = self._table(list(FALLBACK_CALLS))
        self.start = self._state(self._pinned, 0, len(self._tables[self._pinned].rows), 0)

    # ------------------------------------------------------------------ tables and states
    def _encode(self, call: str) -> bytes:
        """``call``'s token ids, as the bytes of an array of the tables' dtype (kept: a turn's calls mostly
        repeat the last turn's)."""
        packed = self._encoded.get(call)
        if packed is None:
            ids = self.tokenizer.encode(call)
            if not ids or self.tokenizer.unk_id in ids or self.eoc_id in ids:
                raise ValueError(f"legal call {call[:60]!r} has words the tokenizer does not know; use a tokenizer "
                                 "that encodes any text (ByteTokenizer)")
            if len(self._encoded) > 200_000:
                self._encoded.clear()
            packed = self._encoded[call] = np.asarray(ids, dtype=self._dtype).tobytes()
        return packed

    def _table(self, calls: Sequence[str], key: str | None = None) -> int:
        """The id of the table of ``calls`` (made, or the kept one of the same calls moved to the newest);
        ``key``: ``calls`` joined by newlines, if the caller has it."""
        key = "\n".join(calls) if key is None else key  # calls are one line each: the same text is the same list
        tid = self._table_of.get(key)
        if tid is not None:
            self._tables.move_to_end(tid)
            return tid
        known = list(map(self._encoded.get, calls))  # a call not seen before is None (a known one is never empty)
        # encode only the calls not seen before (a turn's calls mostly repeat the last turn's)
        encoded = cast(list[bytes], known) if all(known) else [ids or self._encode(c) for ids, c in zip(known, calls)]
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded)) // np.dtype(self._dtype).itemsize
        fits = lengths < self.max_call_tokens  # [n]
        if not fits.all():
            encoded, lengths = [ids for ids, ok in zip(encoded, fits) if ok], lengths[fits]
        if not encoded:
            raise ValueError(f"no legal call fits in max_call_tokens={self.max_call_tokens} tokens")
        tid, self._next_table = self._next_table, self._next_table + 1
        table = self._tables[tid] = _Table(encoded, lengths, self._dtype)
        self._table_of[key], self._calls_of[tid] = tid, key
        self._bytes += table.rows.nbytes + len(key)
        self._forget_oldest()
        return tid

    def _forget_oldest(self) -> None:
        while self._bytes > self.memory_bytes and len(self._tables) > 2:
            tid = next(iter(self._tables))
            if tid == self._pinned:
                self._tables.move_to_end(tid)
                tid = next(iter(self._tables))
            table, key = self._tables.pop(tid), self._calls_of.pop(tid)
            self._bytes -= table.rows.nbytes + len(key)
            del self._table_of[key]
            for state in table.states:
                self._state_of.pop(self._nodes.pop(state), None)
                self._allowed.pop(state, None)

    def _state(self, tid: int, lo: int, hi: int, depth: int) -> int:
        node = (tid, lo, hi, depth)
        state = self._state_of.get(node)
        if state is None:
            state = self._state_of[node] = self._next_state
            self._next_state += 1
            self._nodes[state] = node
            self._tables[tid].states.append(state)
        return state

    def _node(self, state: int) -> tuple[_Table, int, int, int]:
        node = self._nodes.get(state)
        if node is None:
            raise ValueError(f"grammar state {state} is not one of this grammar's (or belongs to a turn it forgot: "
                             f"raise memory_bytes above {self.memory_bytes})")
        tid, lo, hi, depth = node
        return self._tables[tid], lo, hi, depth

    # ------------------------------------------------------------------ CallGrammar's interface
    def start_for(self, calls: Sequence[Any] | None) -> int:
        """The start state of a call that must be one of ``calls`` (the env's ``legal_calls()``; None: the
        :data:`FALLBACK_CALLS`)."""
        if calls is None or len(calls) == 0:
            return self.start
        try:  # one line each: as many line breaks as calls in between
            key = "\n".join(calls)
        except TypeError:
            key = None
        if key is None or key.count("\n") != len(calls) - 1:
            raise ValueError("LegalCallGrammar.start_for takes the legal calls as one-line texts (info['legal_calls'])")
        tid = self._table(calls, key)
        return self._state(tid, 0, len(self._tables[tid].rows), 0)

    def allowed_tokens(self, state: int) -> list[int]:
        """The tokens allowed in ``state``, ``<eoc>`` included once a whole call is written."""
        known = self._allowed.get(state)
        if known is None:
            table, lo, hi, depth = self._node(state)
            column = np.unique(table.rows[lo:hi, depth])
            known = [self.eoc_id if t < 0 else int(t) for t in column]
            self._allowed[state] = known
        return known

    def step(self, state: int, token: int) -> int:
        """The state after writing ``token`` in ``state`` (after ``<eoc>``: the start of the same turn's calls).

        :raises ValueError: ``token`` is not allowed in ``state``
        """
        table, lo, hi, depth = self._node(state)
        tid = self._nodes[state][0]
        column = table.rows[lo:hi, depth]
        if token == self.eoc_id:
            if column[0] >= 0:
                raise ValueError(f"token {token} is not allowed in grammar state {state}")
            return self._state(tid, 0, len(table.rows), 0)
        a = lo + int(np.searchsorted(column, token, side="left"))
        b = lo + int(np.searchsorted(column, token, side="right"))
        if b == a or token < 0:
            raise ValueError(f"token {token} is not allowed in grammar state {state}")
        return self._state(tid, a, b, depth + 1)

    def forced(self, state: int) -> int | None:
        """The one token allowed in ``state``, or None when there is a choice (or no grammar state, ``-1``)."""
        if state < 0:
            return None
        allowed = self.allowed_tokens(state)
        return allowed[0] if len(allowed) == 1 else None

    def rows(self, states: torch.Tensor) -> torch.Tensor:
        """bool [N, V]: the tokens allowed in each of ``states`` [N] (all >= 0)."""
        unique, inverse = torch.unique(states.cpu(), return_inverse=True)
        table = torch.zeros(len(unique), self.vocab_size, dtype=torch.bool)
        for k, state in enumerate(unique.tolist()):
            table[k, self.allowed_tokens(state)] = True
        return table[inverse].to(states.device)

    def _rows(self, states: torch.Tensor) -> torch.Tensor:
        return self.rows(states)

    def mask_logits(self, logits: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
        """``logits`` [N, V] with the tokens not allowed in ``states`` [N] set to ``-inf`` (rows whose state is
        :data:`~agents.decoding.grammar.NO_STATE` unchanged)."""
        free = states < 0  # [N]
        allowed = self.rows(states.clamp(min=0).masked_fill(free, self.start)) | free[:, None]  # [N, V]
        return logits.masked_fill(~allowed, float("-inf"))


class LegalCallsInfo(gym.Wrapper):
    """Adds ``info["legal_calls"]`` (``env.unwrapped.legal_calls()``) to every reset and step of a BugFix-v1 env,
    so that the sampler can start each call of a :class:`LegalCallGrammar` from it."""

    def reset(self, **kwargs: Any):
        obs, info = self.env.reset(**kwargs)
        return obs, self._with_calls(info)

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._with_calls(info)

    def _with_calls(self, info: dict) -> dict:
        info = dict(info)
        info[LEGAL_CALLS_KEY] = cast(Any, self.env.unwrapped).legal_calls()
        return info


__all__ = ["FALLBACK_CALLS", "LEGAL_CALLS_KEY", "LegalCallGrammar", "LegalCallsInfo", "NO_STATE"]
