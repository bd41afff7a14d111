"""The training recipes behind ``bugfix-gym train``: the book's (``--tasks book``) and the
generalisation recipe (``--tasks generated``). docs/generalisation.md has the runs behind them.

A recipe is TokenPPO's settings plus the settings around it: the training envs, the number of env
steps, the tokenizer, the base agent and the validation set. Its ``ppo`` part holds only what differs
from the algorithm's defaults (:class:`agents.algorithms.config.PPOConfig`: a delta, so a default is
written once); ``bugfix-gym train --print-config`` prints the settings a run gets. It names BugFix's
auxiliary losses by their settings (``tool_coef``, ``tool_calls``, ``practice``, ``practice_tasks``);
:func:`ppo_kwargs` turns them into ``aux_losses``. Command-line flags
override single entries. Everything in a recipe is plain JSON (it is written to ``run.json``).
"""

from __future__ import annotations

from typing import Any

PRACTICE_STEPS = 600  # the base agent's Adam steps on edit practice alone, before behaviour cloning

RECIPES: dict[str, dict[str, Any]] = {
    # the book's chapter 8 (the 20 train tasks, 30 iterations of 64 episodes), with grammar-constrained
    # calls and a cost on invalid calls, so valid calls stay above 0.97 (docs/ppo.md has the runs)
    "book": dict(
        env=dict(split="train", invalid_cost=0.1),
        iterations=30,
        timesteps=None,
        n_envs=64,
        tokenizer="book",
        base_agent="auto",
        ppo=dict(),  # TokenPPO's defaults: 64 episodes x 4 epochs x 4 minibatches, lr 1e-3, target_kl 0.02
        grammar=True,
        call_mask=None,
        validation=None,
    ),
    # tools pay: a fresh generated task every episode (generator "train" templates, 30% of the
    # episodes from the templates where reading alone cannot decide), a base agent that imitates
    # blind-op careful play (read, edit, test, revert, edit, submit) and then learns what the edit
    # ops answer on recombined train code (edit practice), TokenPPO held near it by a KL term that
    # keeps learning those answers (on its own episodes and on practice), a price on edits that
    # change nothing, grammar-constrained calls that follow the env's useful-call mask and close
    # the ops the agent's own model expects to change nothing (foresight), and the weights that
    # did best on generated heldout tasks
    "generated": dict(
        env=dict(generated="train", ambiguous_share=0.3, invalid_cost=0.1, no_change_cost=0.1),
        iterations=None,
        timesteps=100_000,
        n_envs=64,
        tokenizer="fixed",
        base_agent=dict(kinds=["careful"], teacher_kwargs={"careful": dict(p_read=1.0, p_test=0.0)},
                        n_tasks=2000, ambiguous_share=0.3, steps=600, batch_size=32, lr=3e-3,
                        tool_coef=1.0, tool_calls=["edit"], practice=4000, practice_steps=PRACTICE_STEPS),
        ppo=dict(ent_coef=0.005, kl_coef=0.05, tool_coef=1.0, tool_calls=["edit"], practice=4000),
        grammar=True,
        call_mask="useful_calls",
        foresight=0.5,
        validation=dict(generated="heldout", n=100, gen_seed=77, every=20),
    ),
}


# ablations of the generalisation recipe (``bugfix-gym train --tasks generated --ablation NAME``):
# what it earns without fresh functions, and without what the tools show
ABLATIONS: dict[str, dict[str, Any]] = {
    # the 20 book train tasks only, for the base agent's demonstrations, for RL and for edit practice
    "book-tasks": dict(env=dict(split="train"), drop_env=["generated", "ambiguous_share"],
                       base_agent=dict(tasks="book", practice_tasks="book"), ppo=dict(practice_tasks="book")),
    # read and test answer a fixed blank line, in the demonstrations, in RL and in validation
    "blind-tools": dict(env=dict(hide_outputs=["read", "test"]),
                        base_agent=dict(env=dict(hide_outputs=["read", "test"]))),
}


# RL does the work (``bugfix-gym train --tasks generated --rl-only``): the generalisation recipe whose
# model decodes under the legal-call grammar only (no foresight, no useful-call mask), in training, in
# validation and when saved. ``--rollout-foresight P`` instead rolls out with the agent's own foresight
# as a teacher (it closes ops for sampling only, the ops are scored without it) and distils its choices
# into the policy (:data:`DISTIL_FORESIGHT`); the saved model still decodes with the grammar alone.
# docs/generalisation.md, "RL-only decoding", has the runs of both
RL_ONLY: dict[str, Any] = dict(call_mask="call_mask", foresight=None)
DISTIL_FORESIGHT: dict[str, Any] = dict(distill=1.0)  # the ppo settings --rollout-foresight adds


def with_rl_only(recipe: dict[str, Any], rollout_foresight: float | None = None) -> dict[str, Any]:
    """The recipe with :data:`RL_ONLY` applied: a new dict.

    :param recipe: the generalisation recipe
    :param rollout_foresight: roll out with foresight at this threshold as a teacher and distil it
        (:data:`DISTIL_FORESIGHT`); None: rollouts decode as the saved model does
    """
    import copy

    out = copy.deepcopy(recipe)
    out.update(copy.deepcopy(RL_ONLY), rl_only=True, rollout_foresight=rollout_foresight)
    if rollout_foresight is not None:
        out["ppo"] = dict(out["ppo"], **DISTIL_FORESIGHT)
    return out


def ppo_kwargs(ppo: dict[str, Any]) -> dict[str, Any]:
    """TokenPPO's keyword arguments of a recipe's ``ppo`` part: its auxiliary-loss settings become
    ``aux_losses`` (:func:`agents.bugfix.aux_losses.aux_losses_from_settings`)."""
    from agents.bugfix.aux_losses import AUX_SETTINGS, aux_losses_from_settings

    kwargs = {name: value for name, value in ppo.items() if name not in AUX_SETTINGS}
    kwargs["aux_losses"] = aux_losses_from_settings(**{name: ppo[name] for name in AUX_SETTINGS if name in ppo})
    return kwargs


def default_base_agent(tok, verbose: int = 0):
    """BugFix-v0's base agent, ``TokenPPO(base_agent="auto")`` on it (the env advertises this function):
    behaviour cloning on scripted play of the book's tasks, seed 0, cached on disk."""
    from agents.bugfix.base_agent import cached_base_agent

    return cached_base_agent(tok, seed=0, verbose=verbose)


def with_ablation(recipe: dict[str, Any], name: str) -> dict[str, Any]:
    """The recipe with ablation ``name`` (a key of :data:`ABLATIONS`) applied: a new dict."""
    import copy

    change = copy.deepcopy(ABLATIONS[name])
    out = copy.deepcopy(recipe)
    env = {k: v for k, v in out["env"].items() if k not in change.get("drop_env", [])}
    out["env"] = dict(env, **change["env"])  # the recipe's other env options (costs) stay
    for part in ("base_agent", "ppo"):
        out[part] = dict(out[part], **change.get(part, {}))
    out["ablation"] = name
    return out


def make_tokenizer(recipe: dict[str, Any]):
    """The recipe's tokenizer: the book's vocabulary, or the fixed one that reads any generated code."""
    from bugfix_gym import build_tokenizer, fixed_tokenizer

    return fixed_tokenizer() if recipe["tokenizer"] == "fixed" else build_tokenizer()


def base_agent(recipe: dict[str, Any], tok, seed: int, verbose: int = 0):
    """The recipe's base agent: ``"auto"`` (TokenPPO's default, the book's) or the one builder,
    :func:`agents.bugfix.base_agent.cached_base_agent`, with the recipe's choices: behaviour cloning
    on ``n_tasks`` episodes of scripted play: on generated train tasks, ``ambiguous_share`` of them
    from ``bugfix_gym.tasks.generator.AMBIGUOUS``, drawn with seed ``1000 + seed``; or, with
    ``tasks="book"``, on the book's 20 train tasks, ``n_tasks / 20`` episodes each. ``env`` holds
    BugFix-v0 options of the demonstration env.

    :param recipe: a recipe (:data:`RECIPES`)
    :param tok: its tokenizer (:func:`make_tokenizer`)
    :param seed: the run's seed
    :param verbose: 1 prints where the agent came from
    """
    spec = recipe["base_agent"]
    if isinstance(spec, str):
        return spec
    import numpy as np

    from bugfix_gym import generate_tasks, make_tasks
    from bugfix_gym.tasks.generator import AMBIGUOUS

    from agents.bugfix.base_agent import cached_base_agent

    spec = dict(spec)
    n_tasks, share = spec.pop("n_tasks"), spec.pop("ambiguous_share")
    if spec.pop("tasks", "generated") == "book":
        tasks = make_tasks("train")
        episodes = max(1, n_tasks // len(tasks))
    else:
        n_ambiguous = round(share * n_tasks)
        tasks = generate_tasks("train", n_tasks - n_ambiguous, seed=1000 + seed)
        tasks += generate_tasks("train", n_ambiguous, seed=1000 + seed, templates=AMBIGUOUS)
        np.random.default_rng(seed).shuffle(tasks)
        episodes = 1
    return cached_base_agent(tok, seed=seed, verbose=verbose, tasks=tasks, episodes_per_task=episodes,
                             kinds=tuple(spec.pop("kinds")), env_kwargs=spec.pop("env", None) or None, **spec)


def validation_tasks(recipe: dict[str, Any]) -> list:
    """The tasks the best weights are chosen on (generated heldout templates, never the test ones)."""
    from bugfix_gym import generate_tasks

    val = recipe["validation"]
    return generate_tasks(val["generated"], val["n"], seed=val["gen_seed"])
