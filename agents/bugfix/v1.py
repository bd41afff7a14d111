"""TinyAgent on BugFix-v1: the env as the sampler plays it, a from-scratch TokenPPO, and the evaluator.

The policy reads and writes bytes (:class:`bugfix_gym.contract.byte_tokenizer.ByteTokenizer`: a HumanEval
function's identifiers are never unknown) and writes its calls under the env's legal calls of each turn
(:class:`agents.decoding.legal_calls.LegalCallGrammar`): ``read``, ``test``, ``locate``, every legal
``edit L.K MUTATION [ARG]``, ``delete L``, ``revert``, ``submit``. The free-text ``patch`` and ``insert`` are not
writable. There is no base agent: the weights start at random (issue 30 is about learning well).

The evaluator reports what the v0 evaluator does where it applies (pass rate, valid calls) and, for v1, the
mean calls and ``test`` calls per episode and the pass rate per defect class: each task's injected bugs
(``RepairTask.bugs``, never shown to the agent) name their family, and
:data:`bugfix_gym.edits.defect_classes.FAMILIES` the classes it stands for (a pack's real bug has none: class
``"unlabelled"``).
"""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any, Sequence

import torch
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import TokenizerLike
from bugfix_gym.core.bpe_v1 import load_bpe_v1
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.scripted_v1 import is_test_call
from bugfix_gym.edits.defect_classes import FAMILIES
from bugfix_gym.tasks.problems import RepairTask

from agents.decoding.legal_calls import LEGAL_CALLS_KEY, LegalCallsInfo
from agents.model.threads import use_threads
from agents.model.tinyagent import TinyAgentConfig
from agents.rollout.sampler import EpisodeSampler
from agents.rollout.trajectory import Trajectory
from agents.rollout.vec_env import FreshInfoDummyVecEnv

V1_MAX_CALL_TOKENS = 40
"""Bytes of the longest call TinyAgent writes, with its ``<eoc>`` (the longest legal call of the train split's
first tasks has 26)."""

UNLABELLED = "unlabelled"
"""The defect class of a task whose bug no injection names (a pack's real bug)."""


def make_v1_env(**env_kwargs: Any) -> LegalCallsInfo:
    """A BugFix-v1 env (``BugFixEnvV1(**env_kwargs)``) whose infos carry ``info["legal_calls"]``."""
    return LegalCallsInfo(BugFixEnvV1(**env_kwargs))


def v1_policy_kwargs(max_len: int = 1024, tokenizer: str | TokenizerLike = "byte", **sizes: Any) -> dict[str, Any]:
    """``policy_kwargs`` of a TinyAgent that plays BugFix-v1: bytes (or BPE tokens) in, legal calls out.

    :param max_len: the context in tokens (tool outputs are cut to fit; an episode that outgrows it is cut)
    :param tokenizer: ``"byte"`` (:class:`ByteTokenizer`), ``"bpe"`` (BugFix-v1's BPE,
        :func:`bugfix_gym.core.bpe_v1.load_bpe_v1`) or a tokenizer that encodes every legal call
    :param sizes: more :class:`agents.model.tinyagent.TinyAgentConfig` fields (``d_model``, ``n_layer``, ...)
    """
    tok = v1_tokenizer(tokenizer)
    config = TinyAgentConfig(vocab_size=tok.vocab_size, max_len=max_len, **sizes)
    return dict(tokenizer=tok, model_config=config, legal_calls=True, call_mask_key=LEGAL_CALLS_KEY)


def v1_tokenizer(tokenizer: str | TokenizerLike = "byte") -> TokenizerLike:
    """A tokenizer for TinyAgent on BugFix-v1 by name (``"byte"`` | ``"bpe"``), or ``tokenizer`` itself."""
    if tokenizer == "byte":
        return ByteTokenizer()
    if tokenizer == "bpe":
        return load_bpe_v1()
    if isinstance(tokenizer, str):
        raise ValueError(f"unknown tokenizer {tokenizer!r:.40}; use 'byte', 'bpe' or a tokenizer instance")
    return tokenizer


def new_v1_ppo(split: str = "train", n_envs: int = 4, seed: int = 0, env_kwargs: dict | None = None,
               model_sizes: dict | None = None, **settings: Any) -> Any:
    """A TokenPPO of a random-init TinyAgent on BugFix-v1's ``split`` (no base agent).

    :param split: the env's split (``"train"``; never ``"test"`` for a model that will be scored on it)
    :param n_envs: envs stepped in lockstep
    :param seed: seeds the envs, the weights and the sampling
    :param env_kwargs: more :class:`BugFixEnvV1` arguments (``tasks``, ``max_turns``, ``bugs``, ...)
    :param model_sizes: :func:`v1_policy_kwargs` arguments (``max_len``, ``d_model``, ...)
    :param settings: TokenPPO settings (``n_episodes``, ``n_epochs``, ``learning_rate``, ...)
    """
    from agents.algorithms.ppo import TokenPPO

    kwargs = dict(split=split, **(env_kwargs or {}))
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(**kwargs) for _ in range(n_envs)])
    settings.setdefault("max_call_tokens", V1_MAX_CALL_TOKENS)
    return TokenPPO("TinyAgentPolicy", venv, policy_kwargs=v1_policy_kwargs(**(model_sizes or {})),
                    base_agent=None, seed=seed, **settings)


def split_tasks(split: str) -> list[RepairTask]:
    """One task of each problem of a BugFix-v1 split (:func:`one_task_per_problem`)."""
    return one_task_per_problem(BugFixEnvV1(split=split).tasks)


def tasks_by_problem(tasks: Sequence[RepairTask]) -> dict[str, list[RepairTask]]:
    """``tasks`` grouped by their function, in function order, each group by task name: the same groups whatever
    the tasks' order, for drawing fixed task sets."""
    by_problem: dict[str, list[RepairTask]] = defaultdict(list)
    for task in tasks:
        by_problem[task.problem].append(task)
    return {problem: sorted(group, key=lambda t: t.name) for problem, group in sorted(by_problem.items())}


def one_task_per_problem(tasks: Sequence[RepairTask]) -> list[RepairTask]:
    """One of each problem's tasks, drawn with the problem's id as seed from its tasks by name (the same tasks
    whatever their order, spread over the injection families), in problem order."""
    return [random.Random(problem).choice(group) for problem, group in tasks_by_problem(tasks).items()]


def task_classes(task: RepairTask) -> tuple[str, ...]:
    """The defect classes of a task's injected bugs (:data:`UNLABELLED` when none is named)."""
    names = sorted({name for bug in task.bugs for name in FAMILIES.get(getattr(bug, "family", ""), ())})
    return tuple(names) or (UNLABELLED,)


def play_v1(agent: Any, tasks: Sequence[RepairTask], n_per_task: int = 1, seed: int = 0,
            max_envs: int = 16, env_kwargs: dict | None = None, greedy: bool = False) -> list[Trajectory]:
    """``n_per_task`` episodes of each task on BugFix-v1 with an algorithm's policy as it samples (its grammar and
    temperature), seeded, in task order; ``greedy`` takes each token the grammar allows with the highest
    probability instead of sampling (the same grammar: no other rule)."""
    from agents.bugfix.evaluation import playing_settings

    model, tok, settings = playing_settings(agent)
    batch = [t for t in tasks for _ in range(n_per_task)]
    if not batch:
        return []
    play = {k: settings.pop(k) for k in ("temperature", "deterministic") if k in settings}
    play["deterministic"] = play.get("deterministic", False) or greedy
    kwargs = dict(tasks=list(tasks), **(env_kwargs or {}))
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(**kwargs) for _ in range(min(max_envs, len(batch)))])
    sampler = EpisodeSampler(venv, tok, **settings)
    with use_threads(getattr(agent, "torch_threads", "auto"), next(model.parameters()).device):
        return sampler.play_tasks(model, batch, generator=torch.Generator().manual_seed(seed), **play)


def evaluate_v1(agent: Any, tasks: Sequence[RepairTask], n_per_task: int = 1, seed: int = 0, *,
                per_task: bool = False, **kwargs: Any) -> dict[str, Any]:
    """Play ``tasks`` (:func:`play_v1`) and summarise: ``pass_rate``, ``mean_calls``, ``mean_test_calls`` (``test``
    and ``locate`` calls, as the baselines count them),
    ``valid_calls`` (the share of calls the env took), ``policy_tokens`` per episode, ``context_cut`` (the share of
    episodes that outgrew the model's context: their last turns are empty, invalid filler calls), ``episodes``, and
    ``per_class``: each defect class -> its tasks' pass rate and episodes (a task of two classes counts in both),
    ``pass_after_test_calls`` (:func:`pass_after_test_calls`); with ``per_task``, each task's pass rate."""
    trajs = play_v1(agent, tasks, n_per_task, seed, **kwargs)
    if not trajs:
        raise ValueError("evaluate_v1 needs at least one task")
    infos = [t.info for t in trajs]
    stats = summarise_v1(tasks, n_per_task, infos, per_task=per_task)
    stats.update(policy_tokens=_mean([float(t.policy_mask.sum()) for t in trajs]),
                 context_cut=_mean([bool(info.get("context_cut")) for info in infos]))
    return stats


def summarise_v1(tasks: Sequence[RepairTask], n_per_task: int, infos: Sequence[dict[str, Any]], *,
                 per_task: bool = False) -> dict[str, Any]:
    """The statistics of :func:`evaluate_v1` that any player's episodes have (a model's, a baseline's): each
    episode's last ``info`` (``actions``, ``hidden_pass``, ``n_invalid``), ``n_per_task`` per task in task order."""
    calls = [len(info.get("actions", ())) for info in infos]
    passed = [bool(info.get("hidden_pass")) for info in infos]
    tests = [sum(map(is_test_call, info.get("actions", ()))) for info in infos]
    stats: dict[str, Any] = dict(
        pass_rate=_mean(passed), mean_calls=_mean(calls), mean_test_calls=_mean(tests),
        valid_calls=1.0 - sum(info.get("n_invalid", 0) for info in infos) / max(1, sum(calls)), episodes=len(infos))
    groups: dict[str, list[bool]] = defaultdict(list)
    for i, task in enumerate(tasks):
        for name in task_classes(task):
            groups[name] += passed[i * n_per_task: (i + 1) * n_per_task]
    stats["per_class"] = {name: dict(pass_rate=_mean(p), episodes=len(p)) for name, p in sorted(groups.items())}
    stats["pass_after_test_calls"] = pass_after_test_calls(passed, tests)
    if per_task:
        stats["per_task"] = {task.name: dict(pass_rate=_mean(passed[i * n_per_task: (i + 1) * n_per_task]),
                                             episodes=n_per_task) for i, task in enumerate(tasks)}
    return stats


def baseline_v1(kind: str, tasks: Sequence[RepairTask], max_turns: int = 12, *, per_task: bool = False
                ) -> dict[str, Any]:
    """A scripted baseline of :mod:`bugfix_gym.core.scripted_v1` (``debugger``, ``brute_force``, ``random``) on
    ``tasks``, one episode each (they are deterministic but ``random``), summarised as :func:`summarise_v1`."""
    from bugfix_gym.core.scripted_v1 import make_policy

    env = BugFixEnvV1(tasks=list(tasks), max_turns=max_turns)
    policy = make_policy(kind, max_turns=max_turns)
    infos = []
    for i, task in enumerate(tasks):
        observation, info = env.reset(seed=i, options={"task": task})
        policy.reset(i)
        done = False
        while not done:
            observation, _, terminated, truncated, info = env.step(policy(observation, info, env.legal_calls))
            done = terminated or truncated
        infos.append(info)
    return summarise_v1(tasks, 1, infos, per_task=per_task)


def pass_after_test_calls(passed: Sequence[bool], test_calls: Sequence[int], ks: Sequence[int] = (0, 1, 2, 3, 4, 5)
                          ) -> dict[int, float]:
    """The share of episodes that passed having made at most ``k`` test calls (``test`` and ``locate``), per ``k``:
    the pass rate a budget of ``k`` test calls allows."""
    return {k: _mean([bool(p) and t <= k for p, t in zip(passed, test_calls)]) for k in ks}


def _mean(xs: Sequence[Any]) -> float:
    return sum(float(x) for x in xs) / len(xs) if xs else float("nan")
