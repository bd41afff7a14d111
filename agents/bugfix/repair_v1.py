"""A repair run on BugFix-v1: the base agent, RL on train-split functions, held-out validation, a test evaluation.

:func:`train_repair` is what ``bugfix-gym train --env BugFix-v1`` runs. The split each part reads:

* the base agent's demonstrations and every training episode: **train** (one-bug tasks, or two-bug with
  ``bugs=2``);
* validation, which picks the kept iteration: **heldout** (``validation_tasks`` tasks per function, fixed);
* the final evaluation, of the base agent and of the kept weights under the same decoding: **test**
  (``eval_tasks`` tasks per function, fixed), read by nothing before it.

Decoding is the legal-call grammar only, at the algorithm's sampling temperature, everywhere.
"""

from __future__ import annotations

import dataclasses
import random
import time
from typing import Any, Callable, Sequence

from stable_baselines3.common.callbacks import BaseCallback

from bugfix_gym.contract.tokens import TokenizerLike
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.tasks.problems import RepairTask

from agents.bugfix.base_agent_v1 import cached_base_agent_v1
from agents.bugfix.recipe_v1 import RepairRecipeV1
from agents.bugfix.v1 import evaluate_v1, make_v1_env, tasks_by_problem, v1_tokenizer
from agents.files.checkpoint import ParameterSnapshot
from agents.model.tinyagent import TinyAgentConfig
from agents.rollout.vec_env import FreshInfoDummyVecEnv


def tasks_per_function(split: str, k: int, bugs: int = 1, seed: int = 0) -> list[RepairTask]:
    """``k`` tasks of each function of ``split`` (all of a function's tasks when it has fewer), drawn with the
    function's id and ``seed``, in function order: fixed sets for validation and evaluation."""
    out: list[RepairTask] = []
    for problem, group in tasks_by_problem(BugFixEnvV1(split=split, bugs=bugs).tasks).items():
        out += random.Random(f"{problem}/{seed}").sample(group, min(k, len(group)))
    return out


def policy_kwargs(tok: TokenizerLike, model_config: TinyAgentConfig) -> dict[str, Any]:
    """A TinyAgent policy that writes BugFix-v1's legal calls with ``tok``."""
    from agents.decoding.legal_calls import LEGAL_CALLS_KEY

    return dict(tokenizer=tok, model_config=model_config, legal_calls=True, call_mask_key=LEGAL_CALLS_KEY)


def new_repair_model(recipe: RepairRecipeV1, algo: str = "ppo", seed: int = 0, verbose: int = 0) -> Any:
    """The algorithm ``algo`` (its preset's settings, the recipe's batch and learning rate:
    :meth:`RepairRecipeV1.algorithm_settings`) on train-split envs, seeded with ``seed``, starting from the recipe's
    base agent (one per ``recipe.base_seed``, cached: every RL seed starts from the same weights, so seeds differ in
    RL only)."""
    from agents.algorithms.presets import make_algorithm

    tok = v1_tokenizer(recipe.tokenizer)
    config = TinyAgentConfig(vocab_size=tok.vocab_size, **recipe.model_sizes())
    base = cached_base_agent_v1(tok, config, recipe.base_seed, recipe.base, recipe.max_call_tokens, verbose=verbose)
    env_kwargs = dict(split="train", bugs=recipe.bugs, max_turns=recipe.max_turns)
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(**env_kwargs) for _ in range(recipe.n_envs)])
    return make_algorithm(algo, "TinyAgentPolicy", venv, seed=seed, policy_kwargs=policy_kwargs(tok, config),
                          base_agent=base, **recipe.algorithm_settings(algo))


class StopAfterMinutes(BaseCallback):
    """Stop ``learn`` at the end of the first rollout after ``minutes`` of wall time, or after ``iterations``."""

    def __init__(self, minutes: float, iterations: int):
        super().__init__(0)
        self.seconds, self.iterations = 60.0 * minutes, int(iterations)
        self.started = time.perf_counter()
        self.done = 0

    def _on_training_start(self) -> None:
        self.started = time.perf_counter()

    def _on_rollout_end(self) -> None:
        self.done += 1

    def _on_step(self) -> bool:
        return self.done < self.iterations and time.perf_counter() - self.started < self.seconds


@dataclasses.dataclass
class RepairResult:
    """What :func:`train_repair` returns (``results.json``): the run's size and wall time, the kept iteration
    and every validation ``(iteration, pass rate)``, the base agent's and the kept weights' test statistics
    (:func:`agents.bugfix.v1.evaluate_v1`; ``base_greedy`` and ``trained_greedy``: the same tasks decoded greedily
    under the same grammar), and per iteration the training batch's mean return (BugFix-v1's
    reward is 1 for a submit that passes the hidden tests, 0 otherwise: the batch's pass rate)."""

    algo: str
    seed: int
    iterations: int
    env_steps: int
    train_s: float
    kept_iteration: int
    validation: list[tuple[int, float]]
    base: dict[str, Any]
    trained: dict[str, Any]
    curve: list[dict[str, Any]]
    base_greedy: dict[str, Any] | None = None
    trained_greedy: dict[str, Any] | None = None
    interrupted: bool = False


def train_repair(recipe: RepairRecipeV1, algo: str = "ppo", seed: int = 0, *, verbose: int = 1,
                 on_model: Callable[[Any], None] | None = None,
                 callbacks: Sequence[BaseCallback] = ()) -> tuple[Any, RepairResult]:
    """Train one seed of the recipe; return the model (the kept weights loaded) and its results.

    :param recipe: the settings
    :param algo: an ``--algo`` name
    :param seed: seeds the base agent, the envs, the weights' updates and the sampling
    :param verbose: 1 prints each validation, 2 also shows the base agent's progress bars while it is made
    :param on_model: called with the model once it is built (e.g. to save a first checkpoint)
    :param callbacks: more SB3 callbacks
    """
    from agents.bugfix.callbacks import KeepBest

    model = new_repair_model(recipe, algo, seed, int(verbose >= 2))
    base_weights = ParameterSnapshot(model.policy, with_optimizer=False)  # evaluated beside the kept ones at the end
    if on_model is not None:
        on_model(model)
    validation_tasks = tasks_per_function("heldout", recipe.validation_tasks, recipe.bugs, seed=0)
    env_kwargs = dict(max_turns=recipe.max_turns)
    keep = KeepBest(validation_tasks, every=recipe.validation_every, seed=seed, env_kwargs=env_kwargs,
                    verbose=int(verbose >= 1), evaluate=evaluate_v1)
    stop = StopAfterMinutes(recipe.minutes, recipe.iterations)
    started = time.perf_counter()
    interrupted = False
    try:
        model.learn(10**12, callback=[stop, keep, *callbacks])
        kept_iteration = keep.best_iteration
    except KeyboardInterrupt:  # keep what validation kept so far (else the base agent), and evaluate it
        interrupted = True
        kept_iteration = keep.best_iteration if keep.restore_best() else 0
        if kept_iteration == 0:
            base_weights.restore()
        if verbose:
            print(f"\ninterrupted: keeping iteration {kept_iteration}'s weights (validation's best so far) "
                  "and evaluating them on the test split; Ctrl-C again stops without saving", flush=True)
    train_s = time.perf_counter() - started
    test_tasks = tasks_per_function("test", recipe.eval_tasks, 1, seed=0)
    trained = evaluate_v1(model, test_tasks, 1, seed=seed, env_kwargs=env_kwargs)
    trained_greedy = evaluate_v1(model, test_tasks, 1, seed=seed, env_kwargs=env_kwargs, greedy=True)
    kept = ParameterSnapshot(model.policy, with_optimizer=False)
    base_weights.restore()  # the base agent, under the same decoding
    base = evaluate_v1(model, test_tasks, 1, seed=seed, env_kwargs=env_kwargs)
    base_greedy = evaluate_v1(model, test_tasks, 1, seed=seed, env_kwargs=env_kwargs, greedy=True)
    kept.restore()
    curve = [dict(iteration=d["iteration"], num_timesteps=d.get("num_timesteps"),
                  pass_rate=d.get("rollout", {}).get("reward")) for d in model.diagnostics]
    result = RepairResult(algo, seed, model.iteration, model.num_timesteps, train_s, kept_iteration,
                          keep.history, base, trained, curve, base_greedy, trained_greedy, interrupted)
    return model, result
