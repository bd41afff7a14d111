"""Foresight: a decoding rule that, once the policy has written a call's op prefix (BugFix-v0: ``edit``),
reads each open op's continuation with the model (without touching the KV cache) and closes the ops the
model expects to answer ``no change``. The prefix and the answer words that mean ``no change`` are the
env's (``metadata["agent_defaults"]["foresight"]``); this module knows none."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from bugfix_gym.contract.tokens import TokenizerLike

from agents.decoding.grammar import CallGrammar
from agents.model.tinyagent import KVCache, TinyAgent


# ---------------------------------------------------------------------- the decoder
def check_threshold(threshold: float) -> None:
    """A foresight threshold's one bound (the policy's, and the command line's ``--foresight``): a
    probability in (0, 1], else a one-line ``ValueError``."""
    if not 0.0 < threshold <= 1.0:
        raise ValueError(f"the foresight threshold must be in (0, 1], got {threshold}")


class Foresight:
    """Before the policy picks an op, close the ops its own model expects to answer ``no change``.

    When a call has been written up to ``op_prefix``, the model reads each open op's continuation
    (``op <eoc>``) and predicts the first word of the tool's answer (:meth:`TinyAgent.peek`). Ops
    whose ``no_change`` words have probability (summed) above ``threshold`` are closed for this call,
    as a call mask closes calls (:meth:`CallGrammar.start_for`): the recorded grammar state carries
    them, so the trainer scores the op with the same mask. If every open op would close, the one least
    expected to change nothing stays open. The prediction is the agent's own: it comes from what the
    model learnt of the ops' answers (``TokenPPO(tool_coef=...)``), nothing else.

    :param grammar: the call grammar, with calls ``<op_prefix> <op>``
    :param tokenizer: the policy's tokenizer (a word tokenizer that knows ``op_prefix`` and ``no_change``)
    :param threshold: the probability of ``no change`` above which an op is closed, in (0, 1]
    :param op_prefix: the word that opens the calls whose op foresight chooses (BugFix-v0: ``"edit"``)
    :param no_change: the words a tool's answer starts with when the op changed nothing (BugFix-v0: ``["no"]``)
    :param teach: close the ops for sampling only: the recorded grammar state is the grammar's (and
        call mask's) alone, so the trainer scores the op under the distribution without foresight,
        and a loss on the chosen ops (:class:`agents.bugfix.aux_losses.ForesightDistillLoss`) teaches
        the policy itself what foresight chose; a model trained so can decode without foresight
    """

    def __init__(self, grammar: CallGrammar, tokenizer: TokenizerLike, threshold: float, *, op_prefix: str,
                 no_change: Sequence[str], teach: bool = False):
        check_threshold(threshold)
        words = getattr(tokenizer, "ids", None)  # the tool's answer starts with its first word in ours only
        if not isinstance(words, dict):
            raise ValueError("foresight reads the tool's first answer word, which only bugfix_gym's own Tokenizer "
                             "puts right after a call; use foresight=None with this tokenizer")
        prefix, no_ids = words.get(op_prefix), [words.get(w) for w in no_change]
        ops = [(k, tokenizer.encode(c)) for k, c in enumerate(grammar.calls) if c.split()[0] == op_prefix]
        if prefix is None or not no_ids or None in no_ids or not ops or any(len(ids) != 2 for _, ids in ops):
            raise ValueError(f"foresight needs a grammar with calls '{op_prefix} <op>' and a tokenizer that knows "
                             f"{op_prefix!r} and {list(no_change)!r}")
        self.grammar, self.threshold, self.teach = grammar, float(threshold), bool(teach)
        self.no_ids = torch.tensor(no_ids)  # [N] the answer words that mean "no change"
        self.node = grammar.step(grammar.start, prefix)  # the state after the prefix: the op comes next
        self.calls = [k for k, _ in ops]  # grammar call index of each op
        self.ops = torch.tensor([ids[1] for _, ids in ops])  # [K] op token ids
        self.continuations = torch.stack([self.ops, torch.full_like(self.ops, tokenizer.eoc_id)], dim=-1)  # [K, 2]

    def refine(self, model: TinyAgent, cache: KVCache, rows: list[int], state: list[int]) -> None:
        """Close, in ``state`` (per row, in place), the ops expected to answer ``no change`` for the
        ``rows`` whose call stands at the op; their cache holds the call so far."""
        g = self.grammar
        at = [b for b in rows if state[b] >= 0 and g.node(state[b]) == self.node]
        if not at:
            return
        device = model.tok_emb.weight.device
        cont = self.continuations.to(device).expand(len(at), *self.continuations.shape)  # [R, K, 2] "op <eoc>"
        logits = model.peek(torch.tensor(at, device=device), cont, cache)  # [R, K, V]
        p_no = torch.softmax(logits.float(), dim=-1)[..., self.no_ids.to(device)].sum(-1).tolist()  # [R][K]
        for b, p in zip(at, p_no):
            open_k = [i for i, k in enumerate(self.calls) if g.is_open(state[b], k)]
            shut = [i for i in open_k if p[i] > self.threshold]
            if open_k and len(shut) == len(open_k):
                shut.remove(min(open_k, key=lambda i: p[i]))
            state[b] = g.close(state[b], [self.calls[i] for i in shut])
