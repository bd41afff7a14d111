"""A training run's settings: the recipe of ``--tasks`` (agents/bugfix/recipes.py) with the flags
given on the command line, checked before any work is done. The result is plain JSON: ``run.json``."""

from __future__ import annotations

import argparse
import copy
from typing import TYPE_CHECKING, Any

from agents.cli.flags import UNSET, set_given, usage_error
from agents.cli.parser import train_flags

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm


def train_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe of ``--tasks`` with the flags given on the command line. The algorithm's settings
    (``ppo``) are built in one pass, each later source winning: the class's defaults < the recipe's
    ``ppo`` part < the ``--algo`` preset < the flags (:func:`_set_algorithm`); ``--preset-only`` leaves the
    recipe's ``ppo`` part (its additions to the loss) out.

    :param args: ``bugfix-gym train``'s parsed command line
    :return: the settings of the run (what ``run.json`` holds)
    """
    recipe = _recipe(args.tasks, args.ablation, args.rl_only, args.rollout_foresight)
    set_given(recipe, args, train_flags(), "run")
    if args.timesteps is not None or args.iterations is not None:  # one budget: the one given
        recipe["iterations" if args.timesteps is not None else "timesteps"] = None
    _check_schedule_and_validation(recipe, args)
    if recipe.get("validation"):
        set_given(recipe["validation"], args, train_flags(), "validation")
    set_given(recipe["env"], args, train_flags(), "env")
    _set_edit_answer_flags(recipe, args)
    _check_rl_only(recipe, args)
    _set_algorithm(recipe, args)
    return dict(recipe, tasks=args.tasks, seed=args.seed, eval_episodes=args.eval_episodes,
                tensorboard=args.tensorboard, save_evaluated=args.save_evaluated)


def _set_algorithm(recipe: dict[str, Any], args: argparse.Namespace) -> None:
    """``--algo``: the recipe's ``ppo`` part becomes the named algorithm's settings, in one pass: the class's
    defaults, then the recipe's (a delta), then the preset's (agents/algorithms/presets.py), then the flags
    given (TRL's names translated). The recipe's settings the class lacks are dropped and listed in
    ``dropped_settings``; a flag given for one is a one-line error.

    :param recipe: the recipe with the flags set, changed in place
    :param args: the parsed command line
    """
    from agents.algorithms.presets import get_preset

    preset = get_preset(args.algo)
    names = _setting_names(preset.cls)
    given = _given_settings(args, preset.settings.get("policy_loss"))
    for option, settings in given.items():
        lacking = sorted(set(settings) - names)
        if lacking:
            raise usage_error("train", f"{option} sets {lacking[0]}, which --algo {args.algo} "
                                       f"({preset.cls.__name__}) does not have; drop it or pick another --algo")
    flags = {name: value for option, settings in given.items() if option not in TRL_FLAGS  # TRL's apply together
             for name, value in settings.items()}  # (cispo reads epsilon_high as its cap)
    ppo = {**_defaults(preset.cls), **_recipe_losses(recipe, args), **preset.settings, **flags}
    recipe["dropped_settings"] = sorted(set(ppo) - names)
    recipe["ppo"] = {name: value for name, value in ppo.items() if name in names}
    recipe["algo"] = args.algo
    recipe["preset_only"] = bool(args.preset_only)


def _recipe_losses(recipe: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """The recipe's ``ppo`` part (its additions to the algorithm's loss: KL, entropy bonus, auxiliary losses),
    or nothing with ``--preset-only``, which is a one-line error with foresight (it reads the tool-output loss
    those additions train).

    :param recipe: the recipe with the flags set
    :param args: the parsed command line
    """
    if not args.preset_only:
        return recipe["ppo"]
    if recipe.get("foresight") is not None or recipe.get("rollout_foresight") is not None:
        raise usage_error("train", "--preset-only trains no tool-output loss, which foresight reads: add "
                                   "--foresight none (and no --rollout-foresight)")
    return {}


def _defaults(cls: type[TokenOnPolicyAlgorithm]) -> dict[str, Any]:
    """The defaults of ``cls``'s settings that a run's ``ppo`` part holds (not ``aux_losses``: the recipe's
    auxiliary-loss settings build it, agents/bugfix/recipes.py)."""
    import dataclasses

    return {field.name: field.default for field in dataclasses.fields(cls.config_class) if field.name != "aux_losses"}


def _setting_names(cls: type[TokenOnPolicyAlgorithm]) -> set[str]:
    """The settings a run's ``ppo`` part may hold for ``cls``: its config's fields, and for TokenPPO the
    recipe's auxiliary-loss settings (agents/bugfix/recipes.py turns them into ``aux_losses``)."""
    import dataclasses

    from agents.algorithms.ppo import TokenPPO
    from agents.bugfix.aux_losses import AUX_SETTINGS

    names = {field.name for field in dataclasses.fields(cls.config_class)}
    return names | set(AUX_SETTINGS) if cls is TokenPPO else names


def _given_settings(args: argparse.Namespace, policy_loss: str | None) -> dict[str, dict[str, Any]]:
    """The settings of the algorithm that the command line gives, by the flag that gives them.

    :param args: the parsed command line
    :param policy_loss: the preset's policy loss (the TRL options change some: ``from_trl``)
    """
    from agents.algorithms.trl_options import TRL_OPTIONS, from_trl

    given: dict[str, dict[str, Any]] = {}
    for flag in train_flags():
        value = getattr(args, flag.name)
        if flag.part == "ppo" and value is not None:
            given[flag.option] = {flag.name: flag.setting(value)}
    for option in ("tool_coef", "practice"):  # _set_edit_answer_flags put them in the ppo part
        if getattr(args, option) is not None:
            given["--" + option.replace("_", "-")] = {option: getattr(args, option)}
    trl = {name: getattr(args, name) for name in TRL_OPTIONS}
    trl["mask_truncated_completions"] = trl["mask_truncated_completions"] or None  # a switch: off = not given
    try:
        for name, value in trl.items():
            if value is not None:
                given["--" + name.replace("_", "-")] = from_trl(**{name: value}, policy_loss=policy_loss)
        together = from_trl(**trl, policy_loss=policy_loss)  # the pairs (cispo's epsilon_high) read together
    except ValueError as e:
        raise usage_error("train", str(e)) from None
    if any(value is not None for value in trl.values()):
        given[TRL_TOGETHER] = together
    return given


#: the TRL flags as typed, and the key of what they give together
TRL_FLAGS = tuple("--" + name.replace("_", "-") for name in
                  ("loss_type", "scale_rewards", "importance_sampling_level", "epsilon", "epsilon_high", "beta",
                   "num_iterations", "mask_truncated_completions"))
TRL_TOGETHER = "the TRL options"


def _recipe(tasks: str, ablation: str | None, rl_only: bool = False,
            rollout_foresight: float | None = None) -> dict[str, Any]:
    """A copy of the recipe of ``--tasks``, with ``--ablation`` and ``--rl-only`` applied.

    :param tasks: ``book`` or ``generated`` (a key of ``RECIPES``)
    :param ablation: an ablation of the generated recipe, or None
    :param rl_only: the generated recipe's model decodes under the call grammar alone
    :param rollout_foresight: with ``rl_only``, foresight teaches the rollouts at this threshold
    """
    from agents.bugfix.recipes import RECIPES, with_ablation, with_rl_only

    if rollout_foresight is not None and not rl_only:
        raise usage_error("train", "--rollout-foresight is a teacher of --rl-only training; add --rl-only")
    recipe = copy.deepcopy(RECIPES[tasks])
    if (ablation is not None or rl_only) and tasks != "generated":
        raise usage_error("train", f"{'--ablation' if ablation else '--rl-only'} is a variant of --tasks generated; "
                                   "add it")
    if ablation is not None:
        recipe = with_ablation(recipe, ablation)
    return with_rl_only(recipe, rollout_foresight) if rl_only else recipe


def _check_rl_only(recipe: dict[str, Any], args: argparse.Namespace) -> None:
    """``--rl-only`` decodes under the call grammar alone: no foresight, no useful-call mask at decoding.

    :param recipe: the recipe with the flags set
    :param args: the parsed command line
    """
    if not args.rl_only:
        return
    if recipe.get("foresight") is not None or recipe.get("call_mask") == "useful_calls":
        raise usage_error("train", "--rl-only decodes with the call grammar alone; drop --foresight and "
                                   "--call-mask useful_calls")
    if recipe.get("rollout_foresight") is not None and not recipe["ppo"].get("tool_coef"):
        raise usage_error("train", "--rollout-foresight reads the model's predictions of the edits' answers; it "
                                   "needs a --tool-coef above 0")


def _check_schedule_and_validation(recipe: dict[str, Any], args: argparse.Namespace) -> None:
    """A linear learning-rate schedule needs an env-step budget; the validation flags need validation.

    :param recipe: the recipe with the run's budget and schedule set
    :param args: the parsed command line
    """
    if recipe.get("lr_schedule") == "linear" and not recipe["timesteps"]:
        raise usage_error("train", "--lr-schedule linear decays over env steps; give --timesteps")
    if (args.average_last is not None or args.save_evaluated) and not recipe.get("validation"):
        raise usage_error("train", "--average-last and --save-evaluated work on the validation evaluations, "
                                   "which only --tasks generated has")


def _set_edit_answer_flags(recipe: dict[str, Any], args: argparse.Namespace) -> None:
    """``--tool-coef``, ``--practice`` and ``--foresight``: the loss that learns what edits answer, in
    behaviour cloning and in PPO, and what builds on it (edit practice, foresight at decoding).

    :param recipe: the recipe, changed in place
    :param args: the parsed command line
    """
    from agents.bugfix.recipes import PRACTICE_STEPS

    if args.tool_coef is not None:
        _need_cloned_base_agent(recipe, "--tool-coef")
        for part in (recipe["base_agent"], recipe["ppo"]):
            part.update(tool_coef=args.tool_coef, tool_calls=["edit"] if args.tool_coef else None)
        if not args.tool_coef:  # what needs the loss goes with it
            recipe["base_agent"].update(practice=0, practice_steps=0)
            recipe["ppo"]["practice"] = 0
            recipe["foresight"] = None
    if args.practice is not None:
        _need_cloned_base_agent(recipe, "--practice")
        for part in (recipe["base_agent"], recipe["ppo"]):
            part.update(practice=args.practice)
        steps = recipe["base_agent"].get("practice_steps") or PRACTICE_STEPS
        recipe["base_agent"]["practice_steps"] = steps if args.practice else 0
    if args.foresight is not UNSET:
        if args.foresight is not None and not recipe["grammar"]:
            raise usage_error("train", "--foresight closes edit ops of the call grammar; this recipe has none")
        recipe["foresight"] = args.foresight
    if (recipe.get("foresight") or recipe["ppo"].get("practice")) and not recipe["ppo"].get("tool_coef"):
        raise usage_error("train", "--practice and --foresight work on what the model learns of the edits' "
                                   "answers; they need a --tool-coef above 0")


def _need_cloned_base_agent(recipe: dict[str, Any], flag: str) -> None:
    """``flag`` changes how the base agent is trained: the recipe must behaviour-clone one (not ``"auto"``).

    :param recipe: the recipe
    :param flag: the flag given, as typed
    """
    if not isinstance(recipe["base_agent"], dict):
        raise usage_error("train", f"{flag} needs a recipe whose base agent is behaviour-cloned (--tasks generated)")
