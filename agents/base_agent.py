"""The base agent: TinyAgent behaviour-cloned on well-formed but unskilled scripted play.

It is the book's stand-in for a pretrained base model (§6.2): it writes valid calls ~98% of
the time and submits most episodes, but passes only when a guessed fix happens to be right.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

from bugfix_gym import BugFixEnv, Task, make_tasks, scripted_policy

from .model import TinyAgent, TinyAgentConfig, sequence_log_probs
from .rollout import collate, scripted_rollout


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of ``x`` where ``mask`` is 1 (x, mask [B, T] -> scalar)."""
    return (x * mask).sum() / mask.sum().clamp(min=1e-8)


def make_base_agent(tok, seed: int = 0, kinds: Sequence[str] = ("random", "blind"), episodes_per_task: int = 8,
                    steps: int = 800, batch_size: int = 32, lr: float = 3e-3,
                    config: TinyAgentConfig | None = None, tasks: Sequence[Task] | None = None,
                    teacher_kwargs: dict[str, dict[str, Any]] | None = None) -> TinyAgent:
    """TinyAgent behaviour-cloned on scripted play over the train tasks (book §6.2).

    Collects ``episodes_per_task`` demonstrations per train task from each scripted policy in
    ``kinds``, then takes ``steps`` Adam steps on random minibatches of cross-entropy over
    policy tokens only. Everything is seeded: the same call returns the same weights (bit for bit
    under the same ``torch.get_num_threads()``; float reductions differ between thread counts).

    :param tok: the tokenizer (``bugfix_gym.build_tokenizer()``)
    :param seed: seeds the model init, the scripted policies and the minibatches
    :param kinds: scripted policies to imitate
    :param episodes_per_task: demonstrations per train task and kind
    :param steps: Adam steps. The book used 200; with this env's token stream 200 steps leave the
        agent prone to answering a tool output that ends in a call word (``... nothing to revert``,
        the ``... | submit`` menu after an empty turn) with an immediate ``<eoc>``, which loops
        into empty calls (valid calls 0.81-0.93 over seeds 0-1); 800 steps land in the book's
        ranges (valid ~0.98, submit ~0.8, pass 0.12-0.22 on both splits)
    :param batch_size: episodes per minibatch
    :param lr: Adam learning rate
    :param config: model sizes (default: ``TinyAgentConfig(vocab_size=tok.vocab_size)``)
    :param tasks: the tasks the scripted policies play (default: the book's 20 train tasks)
    :param teacher_kwargs: extra ``scripted_policy`` arguments per kind, e.g.
        ``{"careful": {"p_read": 0.7}}``
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    demos = []
    tasks = make_tasks("train") if tasks is None else list(tasks)
    for k, kind in enumerate(kinds):
        policy = scripted_policy(kind, seed=seed + k, **(teacher_kwargs or {}).get(kind, {}))
        env = BugFixEnv(tasks=tasks)
        demos += [scripted_rollout(policy, env, task, tok) for task in tasks for _ in range(episodes_per_task)]
    data = collate(demos, tok.pad_id)  # ids [N, T], action_mask [N, T-1]
    model = TinyAgent(config or TinyAgentConfig(vocab_size=tok.vocab_size))
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        idx = torch.randint(len(demos), (batch_size,), generator=gen)  # [b]
        ids = data["ids"][idx]  # [b, T]
        mask = data["action_mask"][idx]  # [b, T-1]
        T = int((data["owner"][idx] > 0).sum(1).max())  # trim shared right padding
        logp = sequence_log_probs(model, ids[:, :T])  # [b, T-1]
        loss = -_masked_mean(logp, mask[:, : T - 1])  # cross-entropy on policy tokens
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model
