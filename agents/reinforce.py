"""REINFORCE on token trajectories (book §6.7), with a small SB3-like surface.

The loop, top to bottom, is the book's:

1. sample ``episodes_per_step`` episodes from random train tasks (seeded generator), at
   temperature 1, in lockstep;
2. advantage = reward - b, with ``b`` an EMA of past batch means fixed *before* the batch
   is seen (eq. 6.3), initialised at the base agent's measured train pass rate;
3. one :func:`policy_gradient_step` (Adam, grad-norm clip) on the surrogate
   ``-A * log pi`` over policy tokens, skipped when every advantage is zero (Adam's
   momentum would still move the weights, book §6.8);
4. held-out evaluation every ``eval_every`` steps.

Surface (chosen to match SB3 where it is natural for a token agent):
``Reinforce(model, tok, ...).learn(total_steps) -> self``, ``predict(observation, state,
episode_start, deterministic) -> (call_text, state)`` where ``state`` is the token history
(like SB3's recurrent policies), ``evaluate(tasks, n_per_task, seed)``, ``save(path)`` /
``Reinforce.load(path)``. ``total_steps`` counts *policy updates* (batches of episodes), the
book's unit, not env steps.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, Optional, Sequence

import torch

from bugfix_gym import OWNER_PROMPT, OWNER_TOOL, BugFixEnv, Tokenizer, encode_segment, make_tasks

from .advantages import EMABaseline, reward_to_go
from .losses import reinforce_loss
from .model import TinyAgent, TinyAgentConfig, sequence_log_probs
from .rollout import Trajectory, collate, rollout_batch, rollout_stats


def policy_gradient_step(model: TinyAgent, optimizer: torch.optim.Optimizer, batch: dict[str, torch.Tensor],
                         advantages: torch.Tensor, mode: str = "token_mean", norm_const: Optional[float] = None,
                         max_grad_norm: float = 1.0, skip_zero: bool = True) -> dict[str, Any]:
    """One REINFORCE update on a collated batch (book §6.7).

    :param model: the policy (trained in place).
    :param optimizer: its optimizer.
    :param batch: output of :func:`agents.rollout.collate` (needs ``ids`` and ``action_mask``).
    :param advantages: ``[B]`` (one per trajectory) or ``[B, T-1]`` (per token); detached.
    :param mode: loss aggregation mode (:func:`agents.losses.aggregate_loss`).
    :param norm_const: constant for ``mode='constant'``.
    :param max_grad_norm: global gradient-norm clip.
    :param skip_zero: when every advantage on a policy token is zero, return without touching
        the optimizer (a zero-gradient Adam step still moves the weights by its momentum).
    :return: ``dict(loss, grad_norm, skipped)``; ``grad_norm`` is measured before clipping.
    """
    mask = batch["action_mask"]  # [B, T-1]
    adv = advantages.detach()
    if skip_zero:
        per_token = adv[:, None].expand_as(mask) if adv.dim() == 1 else adv  # [B, T-1]
        if not bool((per_token * mask != 0).any()):
            return dict(loss=0.0, grad_norm=0.0, skipped=True)
    logp = sequence_log_probs(model, batch["ids"])  # [B, T-1], with grad
    loss = reinforce_loss(logp, adv, mask, mode, norm_const)
    optimizer.zero_grad()
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    optimizer.step()
    return dict(loss=loss.item(), grad_norm=float(grad_norm), skipped=False)


def sample_episodes(model: TinyAgent, tok: Tokenizer, tasks: Sequence, n_per_task: int, seed: int,
                    env_kwargs: Optional[dict] = None) -> list[Trajectory]:
    """``n_per_task`` episodes of each task, sampled at temperature 1 in lockstep (book §6.2 ``sample``)."""
    batch_tasks = [t for t in tasks for _ in range(n_per_task)]
    envs = [BugFixEnv(**(env_kwargs or {})) for _ in batch_tasks]
    return rollout_batch(model, envs, batch_tasks, tok, generator=torch.Generator().manual_seed(seed))


class Reinforce:
    """REINFORCE trainer for a TinyAgent on BugFix tasks (book §6.7).

    :param model: the policy, trained in place (pass ``copy.deepcopy(base)`` to keep the base agent).
    :param tok: the tokenizer the model was built for.
    :param train_tasks: tasks to train on (default: the ``train`` split).
    :param eval_tasks: held-out tasks evaluated every ``eval_every`` steps (default: ``heldout``;
        an empty list turns evaluation off).
    :param episodes_per_step: episodes per update (book: 64).
    :param lr: Adam learning rate (book: 2e-3).
    :param max_grad_norm: gradient-norm clip (book: 1.0).
    :param mode: loss aggregation mode (book: ``token_mean``).
    :param norm_const: constant for ``mode='constant'``.
    :param baseline: ``'ema'`` (book), ``'batch_mean'`` or ``'none'``.
    :param baseline_init: initial EMA value; ``None`` measures the model's train pass rate
        (``baseline_init_episodes`` episodes per train task) before the first step.
    :param baseline_init_episodes: episodes per task for that measurement (book: 16).
    :param ema_decay: EMA weight of the old value (book: 0.9).
    :param use_reward_to_go: per-token advantages ``G_i - b`` (book §6.5) instead of ``R - b``.
    :param eval_every: held-out evaluation period in steps (book: 10).
    :param eval_episodes_per_task: episodes per held-out task per evaluation (book: 8).
    :param env_kwargs: keyword arguments for every ``BugFixEnv`` (e.g. ``call_cost``).
    :param seed: seeds task choice and sampling.
    :param verbose: 1 prints a line at every evaluation.
    """

    def __init__(self, model: TinyAgent, tok: Tokenizer, train_tasks: Optional[Sequence] = None,
                 eval_tasks: Optional[Sequence] = None, episodes_per_step: int = 64, lr: float = 2e-3,
                 max_grad_norm: float = 1.0, mode: str = "token_mean", norm_const: Optional[float] = None,
                 baseline: str = "ema", baseline_init: Optional[float] = None, baseline_init_episodes: int = 16,
                 ema_decay: float = 0.9, use_reward_to_go: bool = False, eval_every: int = 10,
                 eval_episodes_per_task: int = 8, env_kwargs: Optional[dict] = None, seed: int = 0,
                 verbose: int = 0) -> None:
        if baseline not in ("ema", "batch_mean", "none"):
            raise ValueError(f"baseline must be 'ema', 'batch_mean' or 'none', got {baseline!r}")
        self.model, self.tok = model, tok
        self.train_tasks = list(train_tasks) if train_tasks is not None else make_tasks("train")
        self.eval_tasks = list(eval_tasks) if eval_tasks is not None else make_tasks("heldout")
        self.episodes_per_step = episodes_per_step
        self.lr, self.max_grad_norm = lr, max_grad_norm
        self.mode, self.norm_const = mode, norm_const
        self.baseline_kind = baseline
        self.baseline_init, self.baseline_init_episodes = baseline_init, baseline_init_episodes
        self.ema_decay = ema_decay
        self.use_reward_to_go = use_reward_to_go
        self.eval_every, self.eval_episodes_per_task = eval_every, eval_episodes_per_task
        self.env_kwargs = dict(env_kwargs or {})
        self.seed, self.verbose = seed, verbose
        self.optimizer = torch.optim.Adam(model.parameters(), lr=lr)
        self.generator = torch.Generator().manual_seed(seed)
        self.baseline: Optional[EMABaseline] = None
        self.baseline_init_value: Optional[float] = None  # the EMA's start (measured if baseline_init is None)
        self.num_steps = 0
        self.history: list[dict[str, float]] = []  # one record per step
        self.evals: list[tuple[int, float]] = []  # (step, held-out pass rate)
        self.train_time = 0.0  # seconds inside learn(), evaluations included
        self.eval_time = 0.0  # seconds of held-out evaluation inside learn()

    # ------------------------------------------------------------------ training
    def _init_baseline(self) -> None:
        init = self.baseline_init
        if init is None:  # the base agent's pass rate, measured (book §6.2: 16 per task, seed 0)
            trajs = sample_episodes(self.model, self.tok, self.train_tasks, self.baseline_init_episodes,
                                    seed=self.seed, env_kwargs=self.env_kwargs)
            init = rollout_stats(trajs)["pass_rate"]
        self.baseline_init_value = float(init)
        self.baseline = EMABaseline(init, self.ema_decay)

    def _evaluate_heldout(self) -> None:
        if not self.eval_tasks:
            return
        start = time.perf_counter()
        stats = self.evaluate(self.eval_tasks, self.eval_episodes_per_task, seed=100 + self.num_steps)
        self.eval_time += time.perf_counter() - start
        self.evals.append((self.num_steps, stats["pass_rate"]))
        if self.verbose:
            line = f"step {self.num_steps:3d} | held-out pass {stats['pass_rate']:.3f}"
            if self.history:
                last = self.history[-1]
                line += (f" | last batch reward {last['reward']:.3f} | loss {last['loss']:+.4f}"
                         f" | grad norm {last['grad_norm']:.2f}")
            print(line, flush=True)

    def train_step(self) -> dict[str, float]:
        """Sample one batch, compute advantages, take one update; returns the step's record."""
        if self.baseline is None:
            self._init_baseline()
        idx = torch.randint(len(self.train_tasks), (self.episodes_per_step,), generator=self.generator)
        tasks = [self.train_tasks[i] for i in idx.tolist()]
        envs = [BugFixEnv(**self.env_kwargs) for _ in tasks]
        trajs = rollout_batch(self.model, envs, tasks, self.tok, generator=self.generator)
        batch = collate(trajs, self.tok.pad_id)
        rewards = batch["rewards"]  # [B]
        if self.baseline_kind == "ema":
            b = self.baseline.value  # fixed before this batch was seen (eq. 6.3)
        elif self.baseline_kind == "batch_mean":
            b = rewards.mean().item()
        else:
            b = 0.0
        if self.use_reward_to_go:  # per-token G_i - b on policy tokens (book §6.5)
            advantages = (reward_to_go(batch["token_rewards"], batch["action_mask"]) - b) * batch["action_mask"]
        else:
            advantages = rewards - b  # [B], broadcast over each trajectory's policy tokens
        stats = policy_gradient_step(self.model, self.optimizer, batch, advantages, self.mode, self.norm_const,
                                     self.max_grad_norm)
        self.baseline.update(rewards)
        summary = rollout_stats(trajs)
        record = dict(step=self.num_steps, reward=rewards.mean().item(), pass_rate=summary["pass_rate"],
                      valid_calls=summary["valid_calls"], baseline=b, policy_tokens=float(batch["action_mask"].sum()),
                      **stats)
        self.history.append(record)
        self.num_steps += 1
        return record

    def learn(self, total_steps: int, callback: Optional[Callable[["Reinforce", dict], Optional[bool]]] = None
              ) -> "Reinforce":
        """Run ``total_steps`` updates (held-out evaluation every ``eval_every`` steps and at the end).

        :param total_steps: number of policy updates (batches of ``episodes_per_step`` episodes).
        :param callback: called as ``callback(self, record)`` after every step; ``False`` stops.
        :return: self
        """
        start = time.perf_counter()
        if self.baseline is None:
            self._init_baseline()
        for _ in range(total_steps):
            if self.eval_every and self.num_steps % self.eval_every == 0:
                self._evaluate_heldout()
            record = self.train_step()
            if callback is not None and callback(self, record) is False:
                break
        if self.eval_every:
            self._evaluate_heldout()
        self.train_time += time.perf_counter() - start
        return self

    # ------------------------------------------------------------------ using the policy
    def evaluate(self, tasks: Optional[Sequence] = None, n_per_task: int = 16, seed: int = 0) -> dict[str, float]:
        """``rollout_stats`` of ``n_per_task`` sampled episodes per task (default: the train tasks)."""
        tasks = self.train_tasks if tasks is None else tasks
        return rollout_stats(sample_episodes(self.model, self.tok, tasks, n_per_task, seed, self.env_kwargs))

    @torch.no_grad()
    def predict(self, observation: str, state: Optional[list[int]] = None, episode_start: bool = False,
                deterministic: bool = False, generator: Optional[torch.Generator] = None,
                max_call_tokens: int = 8) -> tuple[str, list[int]]:
        """Next call for a ``BugFix-v0`` observation, SB3-style: ``action, state = predict(obs, state)``.

        ``state`` is the episode's token history (``None`` or ``episode_start=True`` starts a
        new episode with ``observation`` as the prompt; otherwise ``observation`` is the last
        tool output). Returns the call text for ``env.step`` and the updated history.
        """
        if state is None or episode_start:
            ids = encode_segment(self.tok, OWNER_PROMPT, observation)
        else:
            ids = list(state) + encode_segment(self.tok, OWNER_TOOL, observation)
        self.model.eval()
        call: list[int] = []
        max_len = self.model.config.max_len
        for _ in range(max_call_tokens):
            context = torch.tensor([ids[-max_len:]])  # [1, T]
            logits, _ = self.model(context)  # [1, T, V]
            logits = logits[0, -1]
            t = int(logits.argmax()) if deterministic else int(torch.multinomial(
                torch.softmax(logits.float(), -1), 1, generator=generator))
            ids.append(t)
            call.append(t)
            if t == self.tok.eoc_id:
                break
        return self.tok.decode(call), ids

    # ------------------------------------------------------------------ persistence
    def save(self, path: str) -> None:
        """Save model weights, config, tokenizer, optimizer, baseline and logs to one file."""
        torch.save(dict(
            format="bugfix-gym/reinforce/v1",
            model_config=dataclasses.asdict(self.model.config),
            model_state=self.model.state_dict(),
            tokenizer=self.tok.to_dict(),
            optimizer_state=self.optimizer.state_dict(),
            baseline=self.baseline.state_dict() if self.baseline is not None else None,
            hparams=dict(episodes_per_step=self.episodes_per_step, lr=self.lr, max_grad_norm=self.max_grad_norm,
                         mode=self.mode, norm_const=self.norm_const, baseline=self.baseline_kind,
                         baseline_init=self.baseline_init, baseline_init_episodes=self.baseline_init_episodes,
                         ema_decay=self.ema_decay, use_reward_to_go=self.use_reward_to_go,
                         eval_every=self.eval_every, eval_episodes_per_task=self.eval_episodes_per_task,
                         env_kwargs=self.env_kwargs, seed=self.seed, verbose=self.verbose),
            train_task_names=[getattr(t, "name", t) for t in self.train_tasks],
            eval_task_names=[getattr(t, "name", t) for t in self.eval_tasks],
            num_steps=self.num_steps, history=self.history, evals=self.evals,
            generator_state=self.generator.get_state(),
        ), path)

    @classmethod
    def load(cls, path: str, train_tasks: Optional[Sequence] = None, eval_tasks: Optional[Sequence] = None,
             **overrides: Any) -> "Reinforce":
        """Rebuild a trainer saved with :meth:`save` (tasks are looked up by name unless given)."""
        from bugfix_gym import get_task
        try:
            data = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as exc:  # noqa: BLE001 - one-line message for a corrupt / foreign file
            raise ValueError(f"{path}: not a Reinforce checkpoint ({type(exc).__name__}: {exc})") from None
        if not isinstance(data, dict) or data.get("format") != "bugfix-gym/reinforce/v1":
            raise ValueError(f"{path}: not a Reinforce checkpoint (missing format 'bugfix-gym/reinforce/v1')")
        tok = Tokenizer.from_dict(data["tokenizer"])
        model = TinyAgent(TinyAgentConfig(**data["model_config"]))
        model.load_state_dict(data["model_state"])
        if train_tasks is None:
            train_tasks = [get_task(n) for n in data["train_task_names"]]
        if eval_tasks is None:
            eval_tasks = [get_task(n) for n in data["eval_task_names"]]
        hparams = dict(data["hparams"], **overrides)
        agent = cls(model, tok, train_tasks=train_tasks, eval_tasks=eval_tasks, **hparams)
        agent.optimizer.load_state_dict(data["optimizer_state"])
        if data["baseline"] is not None:
            agent.baseline = EMABaseline()
            agent.baseline.load_state_dict(data["baseline"])
        agent.num_steps, agent.history, agent.evals = data["num_steps"], data["history"], data["evals"]
        agent.generator.set_state(data["generator_state"])
        return agent


__all__ = ["Reinforce", "policy_gradient_step", "sample_episodes"]
