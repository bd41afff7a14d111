"""Edit practice: transcripts of the edit ops applied to recombined train-template code, for
learning what each edit will answer (``no change`` or the line it changed).

An agent that only learns the answers of the edits it chose on its own episodes ties each op's
site to the shapes of the templates it trained on, and on unseen code it cannot tell which ops
apply. Recombined statements (:func:`bugfix_gym.tasks.generator.recombined_function`) break that tie.
A practice transcript is ``read`` and the source, then three edits of distinct ops with their
answers; only the answers are learnt (the calls are drawn at random, not play to imitate).
Nothing of a task is in it: no statement, tests, defect or fix.
"""

from __future__ import annotations

import numpy as np
import torch

from bugfix_gym import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, Tokenizer, episode_tokens
from bugfix_gym.tasks.generator import edit_practice
from bugfix_gym.core.tools import MENU

from agents.algorithms.losses import masked_mean, tool_output_mask
from agents.model.tinyagent import TinyAgent, sequence_log_probs
from agents.rollout.trajectory import _pad

PRACTICE_PROMPT = f"fix the function f : . calls : {MENU}"  # no statement: the transcript is no task
PRACTICE_TASKS = ("generated", "book")  # whose code the practice recombines


def check_practice_tasks(tasks: object) -> None:
    """One ``ValueError`` unless ``tasks`` is one of :data:`PRACTICE_TASKS`."""
    if tasks not in PRACTICE_TASKS:
        raise ValueError(f"practice_tasks must be 'generated' or 'book' (whose train code edit practice "
                         f"recombines), got {tasks!r}")


class EditPractice:
    """``n`` practice transcripts, tokenized and padded, drawn with ``seed``; :meth:`loss` is the
    cross-entropy of the edits' answers on a random minibatch of them.

    :param tok: the policy's tokenizer
    :param n: number of transcripts
    :param seed: seeds the recombined functions, the ops and the minibatches
    :param tasks: whose statements are recombined: ``"generated"`` (the generator's train templates)
        or ``"book"`` (the book's 20 train tasks)
    """

    def __init__(self, tok: Tokenizer, n: int, seed: int = 0, tasks: str = "generated"):
        if n < 1:
            raise ValueError(f"edit practice needs at least one transcript, got n={n}")
        check_practice_tasks(tasks)
        rng = np.random.default_rng(seed)
        rows = []
        for _ in range(n):
            segments = [(OWNER_PROMPT, PRACTICE_PROMPT)]
            for call, answer in edit_practice(rng, split="train" if tasks == "generated" else "book"):
                segments += [(OWNER_POLICY, call), (OWNER_TOOL, answer)]
            rows.append(episode_tokens(segments, tok))
        T = max(len(ids) for ids, _ in rows)
        self.ids = _pad([torch.from_numpy(ids) for ids, _ in rows], T, tok.pad_id).long()  # [n, T]
        self.owner = _pad([torch.from_numpy(own).long() for _, own in rows], T, 0).long()  # [n, T]
        self.target_mask = tool_output_mask(self.ids, self.owner, [tok.ids["edit"]])  # [n, T-1] the answers
        self.lengths = (self.owner > 0).sum(1)  # [n]
        self.generator = torch.Generator().manual_seed(seed)

    def __len__(self) -> int:
        return len(self.ids)

    def loss(self, model: TinyAgent, batch_size: int) -> torch.Tensor:
        """Mean NLL of the answer tokens of ``batch_size`` transcripts drawn at random."""
        idx = torch.randint(len(self.ids), (batch_size,), generator=self.generator)  # [b]
        T = int(self.lengths[idx].max())  # trim shared right padding
        device = model.tok_emb.weight.device
        logp = sequence_log_probs(model, self.ids[idx, :T].to(device))  # [b, T-1]
        return -masked_mean(logp, self.target_mask[idx, : T - 1].to(device))
