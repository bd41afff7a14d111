"""Foresight: a decoding rule that, once the policy has written ``edit``, reads each open op's
continuation with the model (without touching the KV cache) and closes the ops the model expects to
answer ``no change``."""

from __future__ import annotations

import torch

from bugfix_gym.contract.tokens import TokenizerLike

from agents.decoding.grammar import CallGrammar
from agents.model.tinyagent import KVCache, TinyAgent


# ---------------------------------------------------------------------- the decoder
class Foresight:
    """Before the policy picks an edit's op, close the ops its own model expects to answer ``no change``.

    When a call has been written up to ``edit``, the model reads each open op's continuation
    (``op <eoc>``) and predicts the first word of the tool's answer (:meth:`TinyAgent.peek`). Ops
    whose ``no`` has probability above ``threshold`` are closed for this call, as a call mask
    closes calls (:meth:`CallGrammar.start_for`): the recorded grammar state carries them, so the
    trainer scores the op with the same mask. If every open op would close, the one least
    expected to change nothing stays open. The prediction is the agent's own: it comes from
    what the model learnt of the edits' answers (``TokenPPO(tool_coef=...)``), nothing else.

    :param grammar: the call grammar, with calls ``edit <op>``
    :param tokenizer: the policy's tokenizer (knows ``edit`` and ``no``)
    :param threshold: the probability of ``no change`` above which an op is closed, in (0, 1]
    :param teach: close the ops for sampling only: the recorded grammar state is the grammar's (and
        call mask's) alone, so the trainer scores the op under the distribution without foresight,
        and a loss on the chosen ops (:class:`agents.bugfix.aux_losses.ForesightDistillLoss`) teaches
        the policy itself what foresight chose; a model trained so can decode without foresight
    """

    def __init__(self, grammar: CallGrammar, tokenizer: TokenizerLike, threshold: float, teach: bool = False):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"the foresight threshold must be in (0, 1], got {threshold}")
        words = getattr(tokenizer, "ids", None)  # the tool's answer starts with its first word in ours only
        if not isinstance(words, dict):
            raise ValueError("foresight reads the tool's first answer word, which only bugfix_gym's own Tokenizer "
                             "puts right after a call; use foresight=None with this tokenizer")
        edit, self.no_id = words.get("edit"), words.get("no")
        ops = [(k, tokenizer.encode(c)) for k, c in enumerate(grammar.calls) if c.split()[0] == "edit"]
        if edit is None or self.no_id is None or not ops or any(len(ids) != 2 for _, ids in ops):
            raise ValueError("foresight needs a grammar with calls 'edit <op>' and a tokenizer that knows 'edit' "
                             "and 'no'")
        self.grammar, self.threshold, self.teach = grammar, float(threshold), bool(teach)
        self.node = grammar.step(grammar.start, edit)  # the state after "edit": the op comes next
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
        p_no = torch.softmax(logits.float(), dim=-1)[..., self.no_id].tolist()  # [R][K]
        for b, p in zip(at, p_no):
            open_k = [i for i, k in enumerate(self.calls) if g.is_open(state[b], k)]
            shut = [i for i in open_k if p[i] > self.threshold]
            if open_k and len(shut) == len(open_k):
                shut.remove(min(open_k, key=lambda i: p[i]))
            state[b] = g.close(state[b], [self.calls[i] for i in shut])
