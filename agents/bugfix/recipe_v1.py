"""The RL-only repair recipe on BugFix-v1: every setting of ``bugfix-gym train --env BugFix-v1`` in one dataclass.

A run starts from the v1 base agent (:mod:`agents.bugfix.base_agent_v1`: the scripted debugger behaviour-cloned on
train-split functions), trains an algorithm (``ppo`` by default, any ``--algo`` name) on train-split one-bug
tasks, decoding under the legal-call grammar only (no foresight, no useful-call mask, no hand rule), validates on
the held-out split every few iterations and keeps the weights that did best there; the test split is read only by
the final evaluation.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from agents.bugfix.base_agent_v1 import BaseAgentV1Config


@dataclasses.dataclass(frozen=True)
class RepairRecipeV1:
    """The recipe's settings; ``run.json`` holds them as :func:`dataclasses.asdict` writes them.

    :param tokenizer: ``"bpe"`` (the committed BPE of train-split text) or ``"byte"``
    :param d_model: TinyAgent's width
    :param n_layer: its blocks
    :param n_head: its attention heads
    :param d_ff: its MLP width
    :param max_len: its context in tokens (an episode longer than that is cut)
    :param max_turns: the env's turn budget (the baselines' 12)
    :param bugs: injected bugs per training task (1, or 2 for two-bug tasks)
    :param max_call_tokens: the most tokens a call may take with its ``<eoc>`` (a legal call longer than that is
        left out of the grammar; the longest legal call of the held-out and test functions has 9 BPE tokens)
    :param base: how the base agent is made
    :param base_seed: the base agent's seed (one base agent for every RL seed)
    :param n_envs: envs stepped in lockstep
    :param n_episodes: episodes per iteration
    :param n_epochs: passes over each batch
    :param n_minibatches: minibatches per epoch
    :param learning_rate: Adam's learning rate
    :param ent_coef: entropy bonus (0: none)
    :param kl_coef: weight of a KL penalty to the base agent in the loss (0: none; the algorithm's own KL, if its
        preset has one, is kept when this is 0)
    :param minutes: wall-clock budget of training (validation included); training stops after the iteration that
        crosses it
    :param iterations: the most iterations
    :param validation_every: iterations between held-out evaluations
    :param validation_tasks: held-out tasks per function in each validation (one episode each)
    :param eval_tasks: test-split tasks per function in the final evaluation (one episode each)
    """

    tokenizer: str = "bpe"
    d_model: int = 128
    n_layer: int = 3
    n_head: int = 4
    d_ff: int = 384
    max_len: int = 1024
    max_turns: int = 12
    bugs: int = 1
    max_call_tokens: int = 16
    base: BaseAgentV1Config = BaseAgentV1Config()
    base_seed: int = 0
    n_envs: int = 8
    n_episodes: int = 32
    n_epochs: int = 2
    n_minibatches: int = 4
    learning_rate: float = 1e-4
    ent_coef: float = 0.0
    kl_coef: float = 0.0
    minutes: float = 25.0
    iterations: int = 400
    validation_every: int = 5
    validation_tasks: int = 2
    eval_tasks: int = 4

    def __post_init__(self) -> None:
        if self.tokenizer not in ("bpe", "byte"):
            raise ValueError(f"tokenizer must be 'bpe' or 'byte', got {self.tokenizer!r}")
        if self.bugs not in (1, 2):
            raise ValueError(f"bugs must be 1 or 2, got {self.bugs}")
        for name in ("d_model", "n_layer", "n_head", "d_ff", "max_len", "max_turns", "n_envs", "n_episodes",
                     "n_epochs", "n_minibatches", "iterations", "max_call_tokens", "validation_every",
                     "validation_tasks", "eval_tasks"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if not self.learning_rate > 0 or self.ent_coef < 0 or self.kl_coef < 0 or not self.minutes > 0:
            raise ValueError("learning_rate and minutes must be positive, ent_coef and kl_coef non-negative")

    def model_sizes(self) -> dict[str, Any]:
        """The :class:`agents.model.tinyagent.TinyAgentConfig` fields this recipe sets."""
        return dict(d_model=self.d_model, n_layer=self.n_layer, n_head=self.n_head, d_ff=self.d_ff,
                    max_len=self.max_len)

    def algorithm_settings(self, algo: str = "ppo") -> dict[str, Any]:
        """What the recipe sets of algorithm ``algo``, over its preset: the batch, the learning rate and the longest
        call (every algorithm), the passes, minibatches and entropy bonus (a TokenPPO preset that leaves them to its
        class), a nonzero ``kl_coef`` (it replaces the preset's), and Dr. GRPO's ``L_max`` (the turn budget times the
        longest call); the estimator, the loss, its clip range and, at ``kl_coef`` 0, any KL are the preset's. The
        same for every name, so the algorithms compare at one budget."""
        from agents.algorithms.ppo import TokenPPO
        from agents.algorithms.presets import get_preset

        preset = get_preset(algo)
        out: dict[str, Any] = dict(n_episodes=self.n_episodes, learning_rate=self.learning_rate,
                                   max_call_tokens=self.max_call_tokens)
        if preset.cls is TokenPPO:
            out.update({name: getattr(self, name) for name in ("n_epochs", "n_minibatches", "ent_coef")
                        if name not in preset.settings})
        if self.kl_coef:
            if preset.cls is not TokenPPO:
                raise ValueError(f"kl_coef needs an algorithm with a reference policy; {algo} has none (use 0)")
            out["kl_coef"] = self.kl_coef
        if preset.settings.get("loss_mode") == "seq_mean_token_sum_norm" and "loss_norm_const" not in preset.settings:
            out["loss_norm_const"] = float(self.max_turns * self.max_call_tokens)
        return out

    def trained_settings(self, algo: str = "ppo") -> dict[str, Any]:
        """Every setting of the algorithm a run of ``algo`` trains with (``run.json``'s ``ppo``): its class's
        defaults, then its preset's, then :meth:`algorithm_settings`."""
        from agents.algorithms.presets import get_preset

        cls = get_preset(algo).cls
        defaults = {f.name: f.default for f in dataclasses.fields(cls.config_class) if f.name != "aux_losses"}
        return {**defaults, **get_preset(algo).settings, **self.algorithm_settings(algo)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "RepairRecipeV1":
        """The recipe ``dataclasses.asdict`` wrote (``run.json``'s ``recipe``)."""
        data = dict(data)
        data["base"] = BaseAgentV1Config(**data.get("base", {}))
        return cls(**data)


def with_changes(recipe: RepairRecipeV1, **changes: Any) -> RepairRecipeV1:
    """``recipe`` with ``changes`` (``base_steps=...`` and the other ``base_``-prefixed names of
    :class:`BaseAgentV1Config`'s fields change the base agent's settings)."""
    fields = {f"base_{f.name}" for f in dataclasses.fields(BaseAgentV1Config)}
    base = {k[len("base_"):]: v for k, v in changes.items() if k in fields}
    rest = {k: v for k, v in changes.items() if k not in fields}
    if base:
        rest["base"] = dataclasses.replace(recipe.base, **base)
    return dataclasses.replace(recipe, **rest)
