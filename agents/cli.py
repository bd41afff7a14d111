"""``bugfix-gym``: train, evaluate and play from the command line.

    bugfix-gym train                                  # the demo: TokenPPO on the book's tasks
    bugfix-gym train --tasks generated --seed 0 --out runs/gen0    # the generalisation recipe
    bugfix-gym train --resume runs/gen0               # continue a run stopped by Ctrl-C
    bugfix-gym eval runs/gen0/tokenppo.zip --split heldout
    bugfix-gym eval runs/gen0/tokenppo.zip --generated test --n 200 --gen-seed 1 --json
    bugfix-gym eval runs/gen0/tokenppo.zip --pack examples/task_pack_example.json --episodes 8 --json
    bugfix-gym play --task clamp                      # type the calls yourself

Bad arguments, a missing or unsafe model file: one line on stderr, exit status 2. Ctrl-C during
training saves the last finished iteration (exit status 130); a diverged update stops with one
line and keeps the last good iteration (exit status 1).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Callable, NoReturn, Sequence

EVAL_KEYS = (("pass_rate", "pass rate"), ("valid_calls", "valid calls"), ("submit_rate", "submit rate"),
             ("read_rate", "read rate"), ("test_rate", "test rate"), ("edits_per_episode", "edits / episode"),
             ("first_edit_right", "first edit right"), ("turns", "turns / episode"))
GENERATED_EVAL = dict(n=200, gen_seed=0)  # the unseen-template column of the training table


class UsageError(Exception):
    """A one-line command-line error (exit status 2)."""


class _Parser(argparse.ArgumentParser):
    """argparse, but errors are one line (no usage dump) and exit with status 2."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{self.prog}: error: {message} (see --help)")


# ---------------------------------------------------------------------- argument types
def _number(kind: type, low: float | None = None, high: float | None = None, strict_low: bool = False,
            what: str = "") -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what or kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected a finite number, got {text!r}")
        if low is not None and (value < low or (strict_low and value == low)):
            raise argparse.ArgumentTypeError(f"must be {'>' if strict_low else '>='} {low}, got {text}")
        if high is not None and value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {text}")
        return value
    return parse


POSITIVE_INT = _number(int, 1, what="a positive integer")
NON_NEGATIVE_INT = _number(int, 0, what="an integer >= 0")
SEED = _number(int, 0, 2**32 - 1, what="a seed (0 to 2**32 - 1)")
POSITIVE_FLOAT = _number(float, 0.0, strict_low=True, what="a positive number")
NON_NEGATIVE_FLOAT = _number(float, 0.0, what="a number >= 0")
UNIT_FLOAT = _number(float, 0.0, 1.0, what="a number in [0, 1]")
SHARE = _number(float, 0.0, 1.0, strict_low=True, what="a number in (0, 1]")


_UNSET = object()  # an eval flag that was not given (None is a value: 'none')


def _foresight_arg(text: str) -> float | None:
    return None if text == "none" else SHARE(text)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="bugfix-gym", description="Train and evaluate token-level agents on BugFix-v0.")
    sub = parser.add_subparsers(dest="command", metavar="{train,eval,play}", parser_class=_Parser)

    train = sub.add_parser("train", help="train TokenPPO from the base agent (the demo)",
                           description="Train TokenPPO from the behaviour-cloned base agent, print a before/after "
                                       "table (train tasks, the book's held-out tasks, unseen generated templates), "
                                       "save the model and a learning-curve PNG under the output folder. Flags "
                                       "left out take the recipe's value (agents/bugfix/recipes.py).")
    train.add_argument("--tasks", choices=("book", "generated"), default="book",
                       help="book: the book's 20 train tasks; generated: a fresh generated task every episode "
                            "(the generalisation recipe) (default: book)")
    train.add_argument("--ablation", choices=("book-tasks", "blind-tools"),
                       help="with --tasks generated: the recipe on the 20 book train tasks only (book-tasks), or "
                            "with the outputs of read and test blanked (blind-tools)")
    train.add_argument("--call-mask", choices=("none", "call_mask", "useful_calls"),
                       help="which env call mask the grammar follows when it decodes a call: none, the legal calls "
                            "(call_mask), or the legal calls without those the episode has shown to be useless "
                            "(useful_calls)")
    budget = train.add_mutually_exclusive_group()
    budget.add_argument("--timesteps", type=POSITIVE_INT,
                        help="environment steps to train for (SB3's count: every vector-env step is n_envs steps)")
    budget.add_argument("--iterations", type=POSITIVE_INT, help="PPO iterations to train for (the book's count)")
    train.add_argument("--n-envs", type=POSITIVE_INT, help="environments stepped in lockstep")
    train.add_argument("--n-episodes", type=POSITIVE_INT, help="episodes per PPO iteration")
    train.add_argument("--n-epochs", type=POSITIVE_INT, help="epochs per batch")
    train.add_argument("--n-minibatches", type=POSITIVE_INT, help="minibatches per epoch")
    train.add_argument("--learning-rate", type=POSITIVE_FLOAT, help="Adam learning rate")
    train.add_argument("--lr-schedule", choices=("constant", "linear"),
                       help="constant learning rate, or linear from --learning-rate down to 0 at the end of the "
                            "budget (with --timesteps; the recipe's by default)")
    train.add_argument("--average-last", type=SHARE, metavar="SHARE",
                       help="keep the mean of the weights of the latest SHARE of the validation evaluations "
                            "instead of the best ones (in (0, 1]; a recipe with validation, --tasks generated)")
    train.add_argument("--save-evaluated", action="store_true",
                       help="also save the weights of every validation evaluation as DIR/evaluated/iteration-N.zip "
                            "(~2 MB each), to evaluate them with `bugfix-gym eval` (--tasks generated)")
    train.add_argument("--tool-coef", type=NON_NEGATIVE_FLOAT, metavar="COEF",
                       help="weight of an auxiliary loss that predicts what each edit answered (`no change` or the "
                            "line it changed), in behaviour cloning and in PPO; 0 turns it off, and with it "
                            "--practice and --foresight")
    train.add_argument("--foresight", type=_foresight_arg, metavar="P", default=_UNSET,
                       help="before the policy picks an edit's op, close the ops its own model gives a probability "
                            "above P (in (0, 1]) of answering `no change`; 'none': off")
    train.add_argument("--practice", type=NON_NEGATIVE_INT, metavar="N",
                       help="also learn what the edits answer on N edit-practice transcripts (recombined "
                            "train-template code), in behaviour cloning and in PPO; 0: off")
    train.add_argument("--no-change-cost", type=NON_NEGATIVE_FLOAT, metavar="COST",
                       help="env option of the training envs: the price of an edit that answered `no change`")
    train.add_argument("--gae-lambda", type=UNIT_FLOAT, help="GAE lambda, in [0, 1]")
    train.add_argument("--ent-coef", type=NON_NEGATIVE_FLOAT, help="entropy bonus coefficient")
    train.add_argument("--target-kl", type=NON_NEGATIVE_FLOAT, help="KL early-stop target; 0 turns it off")
    train.add_argument("--target-kl-mode", choices=("minibatch", "epoch"),
                       help="early-stop rule: SB3's per-minibatch 1.5x rule or the book's per-epoch one")
    train.add_argument("--seed", type=SEED, default=0, help="seed (default: 0)")
    train.add_argument("--eval-episodes", type=POSITIVE_INT, default=8,
                       help="episodes per task for the before/after table (default: 8)")
    train.add_argument("--out", type=Path, default=None, help="output folder (default: a new runs/tokenppo-<time>)")
    train.add_argument("--resume", type=Path, default=None, metavar="DIR",
                       help="continue the run in DIR (stopped by Ctrl-C) with the arguments it was started with")
    train.add_argument("--tensorboard", action="store_true", help="also write TensorBoard logs under the output folder")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")

    ev = sub.add_parser("eval", help="evaluate a saved model",
                        description="Sample episodes with a saved model and print the pass rate and behaviour "
                                    "statistics, as a table or (--json) one JSON object.")
    ev.add_argument("model", type=Path, help="a model .zip file (from `bugfix-gym train` or model.save)")
    where = ev.add_mutually_exclusive_group()
    where.add_argument("--split", choices=("train", "heldout", "all"), help="the book's tasks (default: heldout)")
    where.add_argument("--pack", type=Path, metavar="FILE", help="a task pack (.json / .toml)")
    where.add_argument("--generated", choices=("train", "heldout", "test"), metavar="SPLIT",
                       help="generated tasks from the generator's train / heldout / test templates")
    ev.add_argument("--n", type=POSITIVE_INT, default=200, help="with --generated: number of tasks (default: 200)")
    ev.add_argument("--gen-seed", type=SEED, default=0, help="with --generated: generator seed (default: 0)")
    ev.add_argument("--episodes", type=POSITIVE_INT, default=None,
                    help="episodes per task (default: 8, or 1 with --generated)")
    ev.add_argument("--seed", type=SEED, default=0, help="sampling seed (default: 0)")
    ev.add_argument("--hide-outputs", action="store_true",
                    help="blank the outputs of read and test (for models trained with --ablation blind-tools)")
    ev.add_argument("--call-mask", choices=("none", "call_mask", "useful_calls"),
                    help="decode under this env call mask instead of the model's own (a model with a call grammar)")
    ev.add_argument("--foresight", type=_foresight_arg, metavar="P", default=_UNSET,
                    help="decode with this foresight threshold (in (0, 1]; 'none': off) instead of the model's own")
    ev.add_argument("--json", action="store_true", help="print one JSON object instead of a table")

    sub.add_parser("play", help="play BugFix-v0 yourself in the terminal (bugfix_gym.play)", add_help=False)
    return parser


# ---------------------------------------------------------------------- shared pieces
def _table(rows: dict[str, dict[str, float]]) -> str:
    """Columns of evaluation results -> a plain-text table."""
    cols = list(rows)
    width = max(max(len(c) for c in cols) + 2, 10)
    lines = ["".ljust(18) + "".join(c.rjust(width) for c in cols)]
    for key, label in EVAL_KEYS:
        if all(key in rows[c] for c in cols):
            lines.append(label.ljust(18) + "".join(f"{rows[c][key]:.3f}".rjust(width) for c in cols))
    return "\n".join(lines)


def _eval_sets(tasks_mode: str, episodes: int) -> dict[str, tuple[list, int]]:
    """The task sets of the before/after table: name -> (tasks, episodes per task)."""
    from bugfix_gym import generate_tasks, make_tasks

    unseen = generate_tasks("test", GENERATED_EVAL["n"], seed=GENERATED_EVAL["gen_seed"])
    if tasks_mode == "book":
        return {"train": (make_tasks("train"), episodes), "held-out": (make_tasks("heldout"), episodes),
                "unseen": (unseen, 1)}
    return {"train tmpl": (generate_tasks("train", GENERATED_EVAL["n"], seed=10_000), 1),
            "book held-out": (make_tasks("heldout"), episodes), "unseen": (unseen, 1)}


def _plot(diagnostics: list[dict[str, Any]], path: Path, title: str,
          validation: list[tuple[int, float]] | None = None) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [d for d in diagnostics if "rollout" in d]
    it = [d["iteration"] for d in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label in (("pass_rate", "pass rate"), ("valid_calls", "valid calls"), ("read_rate", "read rate"),
                       ("test_rate", "test rate")):
        ax.plot(it, [d["rollout"].get(key, float("nan")) for d in rows], label=label)
    if validation:
        ax.plot(*zip(*validation), "k.--", label="validation pass rate")
    ax.set_xlabel("PPO iteration")
    ax.set_ylim(0, 1.02)
    ax.set_title(title)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _check_out(out: Path) -> None:
    if out.exists() and not out.is_dir():
        raise UsageError(f"bugfix-gym train: error: --out {out} is a file, not a folder")
    if out.exists() and (out / "run.json").exists():
        raise UsageError(f"bugfix-gym train: error: {out} already holds a run; continue it with --resume {out} "
                         "or choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise UsageError(f"bugfix-gym train: error: cannot write to {out} ({e.strerror or type(e).__name__})") from None


def _make_env(settings: dict[str, Any], n_envs: int, seed: int):
    from stable_baselines3.common.env_util import make_vec_env

    import bugfix_gym  # noqa: F401  (registers BugFix-v0)

    return make_vec_env("BugFix-v0", n_envs=n_envs, seed=seed, env_kwargs=dict(settings["env"], render_mode=None))


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The recipe of ``--tasks`` with the flags given on the command line."""
    import copy

    from agents.bugfix.recipes import PRACTICE_STEPS, RECIPES, with_ablation

    recipe = copy.deepcopy(RECIPES[args.tasks])
    if args.ablation is not None:
        if args.tasks != "generated":
            raise UsageError("bugfix-gym train: error: --ablation is an ablation of --tasks generated; add it")
        recipe = with_ablation(recipe, args.ablation)
    ppo = recipe["ppo"]
    for flag in ("n_episodes", "n_epochs", "n_minibatches", "learning_rate", "gae_lambda", "ent_coef",
                 "target_kl", "target_kl_mode"):
        if getattr(args, flag) is not None:
            ppo[flag] = getattr(args, flag)
    if ppo.get("target_kl") == 0:
        ppo["target_kl"] = None
    if args.call_mask is not None:
        recipe["call_mask"] = None if args.call_mask == "none" else args.call_mask
    if args.lr_schedule is not None:
        recipe["lr_schedule"] = args.lr_schedule
    for flag in ("timesteps", "iterations", "n_envs"):
        if getattr(args, flag) is not None:
            recipe[flag] = getattr(args, flag)
    if args.timesteps is not None or args.iterations is not None:  # one budget: the one given
        recipe["iterations" if args.timesteps is not None else "timesteps"] = None
    if recipe.get("lr_schedule") == "linear" and not recipe["timesteps"]:  # before any work is done
        raise UsageError("bugfix-gym train: error: --lr-schedule linear decays over env steps; give --timesteps")
    if (args.average_last is not None or args.save_evaluated) and not recipe.get("validation"):
        raise UsageError("bugfix-gym train: error: --average-last and --save-evaluated work on the validation "
                         "evaluations, which only --tasks generated has")
    if args.average_last is not None:
        recipe["validation"]["average_last"] = args.average_last
    if args.no_change_cost is not None:
        recipe["env"]["no_change_cost"] = args.no_change_cost
    learnt = isinstance(recipe["base_agent"], dict)  # a behaviour-cloned base agent: --tasks generated
    if args.tool_coef is not None:
        if not learnt:
            raise UsageError("bugfix-gym train: error: --tool-coef needs a recipe whose base agent is behaviour-cloned "
                             "(--tasks generated)")
        for part in (recipe["base_agent"], recipe["ppo"]):
            part.update(tool_coef=args.tool_coef, tool_calls=["edit"] if args.tool_coef else None)
        if not args.tool_coef:  # what needs the loss goes with it
            recipe["base_agent"].update(practice=0, practice_steps=0)
            recipe["ppo"]["practice"] = 0
            recipe["foresight"] = None
    if args.practice is not None:
        if not learnt:
            raise UsageError("bugfix-gym train: error: --practice needs a recipe whose base agent is behaviour-cloned "
                             "(--tasks generated)")
        for part in (recipe["base_agent"], recipe["ppo"]):
            part.update(practice=args.practice)
        steps = recipe["base_agent"].get("practice_steps") or PRACTICE_STEPS
        recipe["base_agent"]["practice_steps"] = steps if args.practice else 0
    if args.foresight is not _UNSET:
        if args.foresight is not None and not recipe["grammar"]:
            raise UsageError("bugfix-gym train: error: --foresight closes edit ops of the call grammar; this recipe "
                             "has none")
        recipe["foresight"] = args.foresight
    if (recipe.get("foresight") or recipe["ppo"].get("practice")) and not recipe["ppo"].get("tool_coef"):
        raise UsageError("bugfix-gym train: error: --practice and --foresight work on what the model learns of the "
                         "edits' answers; they need a --tool-coef above 0")
    return dict(recipe, tasks=args.tasks, seed=args.seed, eval_episodes=args.eval_episodes,
                tensorboard=args.tensorboard, save_evaluated=args.save_evaluated)


def _set_lr_schedule(model: Any, settings: dict[str, Any]) -> None:
    """The recipe's learning-rate schedule: ``"linear"`` decays ``ppo.learning_rate`` to 0 over the run's env
    steps (SB3's ``LinearSchedule`` of the progress remaining); ``"constant"`` (or none) keeps it."""
    if (settings.get("lr_schedule") or "constant") == "constant":
        return
    from stable_baselines3.common.utils import LinearSchedule

    model.learning_rate = LinearSchedule(settings["ppo"]["learning_rate"], 0.0, 1.0)
    model._setup_lr_schedule()


def _eval_env(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The env options that evaluation shares with training: blanked tool outputs, if any."""
    hidden = settings["env"].get("hide_outputs")
    return dict(hide_outputs=hidden) if hidden else None


def _check_memory(settings: dict[str, Any], model_config: dict[str, Any]) -> None:
    from agents.files.runs import available_memory_bytes, estimate_memory_bytes

    ppo = settings["ppo"]
    need = estimate_memory_bytes(ppo["n_episodes"], settings["n_envs"], model_config["max_len"],
                                 model_config["d_model"], model_config["n_layer"], model_config["vocab_size"],
                                 math.ceil(ppo["n_episodes"] / ppo["n_minibatches"]))
    have = available_memory_bytes()
    if have is None:
        return
    if need > 0.8 * have:
        raise UsageError(f"bugfix-gym train: error: this run needs about {need / 2**30:.1f} GiB of memory but "
                         f"{have / 2**30:.1f} GiB is available; lower --n-episodes or --n-envs")
    if need > 0.5 * have:
        print(f"warning: this run needs about {need / 2**30:.1f} GiB of the {have / 2**30:.1f} GiB available",
              file=sys.stderr)


# ---------------------------------------------------------------------- train
def cmd_train(args: argparse.Namespace) -> int:
    import torch

    from agents.bugfix import recipes
    from agents.algorithms.callbacks import KeepBest, StopAfterIterations
    from agents.model.tinyagent import TinyAgentConfig
    from agents.algorithms.ppo import DivergenceError, TokenPPO
    from agents.files.runs import MODEL_FILE, RESUME_FILE, RUN_FILE, Snapshots, new_run_dir, restore_training_state

    torch.set_num_threads(1)  # a ~150k-parameter model: one thread beats two on a small, shared CPU
    t0 = time.perf_counter()
    if args.resume is not None:
        out = args.resume
        try:
            settings = json.loads((out / RUN_FILE).read_text())
            resume_state = json.loads((out / RESUME_FILE).read_text())
        except (OSError, ValueError) as e:
            raise UsageError(f"bugfix-gym train: error: {out} is not a run that can be resumed "
                             f"({type(e).__name__}: it needs {RUN_FILE} and {RESUME_FILE})") from None
        env = _make_env(settings, settings["n_envs"], settings["seed"])
        try:
            model = TokenPPO.load(out / MODEL_FILE, env=env, tensorboard_log=str(out / "tb") if settings["tensorboard"]
                                  else None)
        except (FileNotFoundError, ValueError) as e:
            raise UsageError(f"bugfix-gym train: error: {e}") from None
        restore_training_state(model, resume_state)
        _set_lr_schedule(model, settings)
        _check_memory(settings, model.policy_kwargs["model_config"])
        print(f"resuming {out} at iteration {model._iteration} ({model.num_timesteps} env steps done)", flush=True)
        before = None
    else:
        settings = _settings(args)
        out = args.out if args.out is not None else None
        if out is not None:
            _check_out(out)
        print("setting up: base agent (behaviour cloning, cached after the first run) ...", flush=True)
        env = _make_env(settings, settings["n_envs"], settings["seed"])
        tok = recipes.make_tokenizer(settings)
        policy_kwargs: dict[str, Any] = {"tokenizer": tok}
        if settings["grammar"]:
            from bugfix_gym import CALLS
            policy_kwargs["call_grammar"] = list(CALLS)
            policy_kwargs["call_mask_key"] = settings.get("call_mask")
            policy_kwargs["foresight"] = settings.get("foresight")
        _check_memory(settings, dataclasses.asdict(TinyAgentConfig(vocab_size=tok.vocab_size)))  # before any work
        base_agent = recipes.make_base_agent(settings, tok, settings["seed"])
        model = TokenPPO("TinyAgentPolicy", env, seed=settings["seed"], policy_kwargs=policy_kwargs,
                         base_agent=base_agent, tensorboard_log=None, **recipes.ppo_kwargs(settings["ppo"]))
        _set_lr_schedule(model, settings)
        _check_memory(settings, model.policy_kwargs["model_config"])  # the sizes the base agent brought
        out = out or new_run_dir()
        if settings["tensorboard"]:
            model.tensorboard_log = str(out / "tb")
        (out / RUN_FILE).write_text(json.dumps(settings, indent=1))
        print(f"  ready in {time.perf_counter() - t0:.0f} s; evaluating the base agent ...", flush=True)
        before = {name: model.evaluate(tasks, k, seed=settings["seed"], env_kwargs=_eval_env(settings))
                  for name, (tasks, k) in _eval_sets(settings["tasks"], settings["eval_episodes"]).items()}
    snapshots = Snapshots()
    callbacks: list[Any] = [snapshots]
    if settings.get("iterations"):  # the book counts iterations; SB3's loop then runs until the callback stops it
        remaining, unit = settings["iterations"] - model._iteration, "iterations"
        callbacks.append(StopAfterIterations(remaining))
        total_timesteps = 10**12
    else:
        remaining, unit = settings["timesteps"] - model.num_timesteps, "env steps"
        total_timesteps = remaining
    keep_best = None
    if settings.get("validation"):  # evaluated every few iterations; the best weights are the result
        keep_best = KeepBest(recipes.validation_tasks(settings), every=settings["validation"]["every"],
                             seed=settings["seed"], env_kwargs=_eval_env(settings),
                             average_last=settings["validation"].get("average_last"),
                             save_dir=out / "evaluated" if settings.get("save_evaluated") else None)
        callbacks.append(keep_best)
    t1 = time.perf_counter()
    print(f"training TokenPPO for {remaining} {unit} ({settings['n_envs']} envs, at least "
          f"{model.n_episodes} episodes per iteration) ...", flush=True)
    try:
        model.learn(total_timesteps, callback=callbacks, progress_bar=not args.no_progress and unit == "env steps",
                    reset_num_timesteps=args.resume is None)
    except KeyboardInterrupt:
        path = snapshots.save(out) if snapshots.last is not None else None
        saved = f"saved iteration {snapshots.iteration} to {path}" if path else "nothing to save yet"
        print(f"\nbugfix-gym: interrupted; {saved}; continue with: bugfix-gym train --resume {out}", file=sys.stderr)
        return 130
    except DivergenceError as e:
        path = snapshots.save(out) if snapshots.last is not None else None
        print(f"bugfix-gym: {e}. Kept the last good iteration ({snapshots.iteration}) in {path}", file=sys.stderr)
        return 1
    train_s = time.perf_counter() - t1
    validation = None
    if keep_best is not None:
        val = settings["validation"]
        on = f"{len(keep_best.history)} evaluations on {val['n']} generated {val['generated']} tasks"
        if keep_best.averaged_iterations:
            first, last = keep_best.averaged_iterations[0], keep_best.averaged_iterations[-1]
            print(f"kept the mean of the weights of iterations {first}-{last} ({len(keep_best.averaged_iterations)} "
                  f"of {on}): validation pass rate {keep_best.average_pass_rate:.3f} (best single weights "
                  f"{keep_best.best_pass_rate:.3f}, iteration {keep_best.best_iteration})")
            validation = dict(averaged_iterations=keep_best.averaged_iterations,
                              average_pass_rate=keep_best.average_pass_rate, history=keep_best.history)
        else:
            print(f"kept the weights of iteration {keep_best.best_iteration}: validation pass rate "
                  f"{keep_best.best_pass_rate:.3f} (best of {on})")
            validation = dict(kept_iteration=keep_best.best_iteration, history=keep_best.history)
    model_path = out / MODEL_FILE
    model.save(model_path)
    (out / RESUME_FILE).unlink(missing_ok=True)
    after = {name: model.evaluate(tasks, k, seed=settings["seed"], env_kwargs=_eval_env(settings))
             for name, (tasks, k) in _eval_sets(settings["tasks"], settings["eval_episodes"]).items()}
    print(f"\n{model._iteration} iterations, {model.num_timesteps} env steps, {model.total_policy_tokens} policy "
          f"tokens in {train_s:.0f} s\n")
    columns = {}
    for name in after:
        if before is not None:
            columns[f"base {name}"] = before[name]
        columns[f"PPO {name}"] = after[name]
    print(_table(columns))
    png = out / "learning_curve.png"
    _plot(model.diagnostics, png, f"TokenPPO on BugFix-v0 ({settings['tasks']} tasks, seed {settings['seed']})",
          validation=keep_best.history if keep_best is not None else None)
    (out / "results.json").write_text(json.dumps(_jsonable({"before": before, "after": after, "train_s": train_s,
                                                            "validation": validation, "settings": settings}),
                                                 indent=1))
    print(f"\nsaved {model_path}, {png} and {out / 'results.json'}  (total {time.perf_counter() - t0:.0f} s)")
    print(f"evaluate again with: bugfix-gym eval {model_path} --generated test --n 200")
    return 0


# ---------------------------------------------------------------------- eval
def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from bugfix_gym import TaskPackError, generate_tasks, load_task_pack, make_tasks
    from bugfix_gym.env import HIDEABLE

    from agents.algorithms.ppo import TokenPPO

    torch.set_num_threads(1)
    try:
        model = TokenPPO.load(args.model)
    except FileNotFoundError:
        raise UsageError(f"bugfix-gym eval: error: no model file at {args.model}") from None
    except ValueError as e:
        raise UsageError(f"bugfix-gym eval: error: {e}") from None
    if args.pack is not None:
        try:
            tasks, what = load_task_pack(args.pack), f"pack {args.pack}"
        except TaskPackError as e:
            raise UsageError(f"bugfix-gym eval: error: {e}") from None
        episodes = args.episodes or 8
    elif args.generated is not None:
        tasks, what = generate_tasks(args.generated, args.n, seed=args.gen_seed), \
            f"generated {args.generated} (n={args.n}, gen-seed {args.gen_seed})"
        episodes = args.episodes or 1
    else:
        split = args.split or "heldout"
        tasks, what, episodes = make_tasks(split), f"{split} split", args.episodes or 8
    if args.call_mask is not None:
        if model.policy.grammar is None:
            raise UsageError("bugfix-gym eval: error: --call-mask needs a model with a call grammar; this one writes "
                             "free text")
        model.policy.call_mask_key = None if args.call_mask == "none" else args.call_mask
    if args.foresight is not _UNSET:
        if model.policy.grammar is None:
            raise UsageError("bugfix-gym eval: error: --foresight needs a model with a call grammar; this one writes "
                             "free text")
        from agents.decoding.foresight import Foresight
        model.policy.foresight = None if args.foresight is None else \
            Foresight(model.policy.grammar, model.policy.tokenizer, args.foresight)
    env_kwargs = dict(hide_outputs=list(HIDEABLE)) if args.hide_outputs else None
    stats = model.evaluate(tasks, episodes, seed=args.seed, env_kwargs=env_kwargs)
    if args.json:
        print(json.dumps(_jsonable(dict(stats, model=str(args.model), tasks=what, episodes_per_task=episodes,
                                        call_mask=model.policy.call_mask_key,
                                        foresight=None if model.policy.foresight is None
                                        else model.policy.foresight.threshold))))
    else:
        print(_table({f"{args.model.name} on {what}": stats}))
    return 0


def _jsonable(obj: Any) -> Any:
    """NaN (a rate over no episodes) -> null, so the output is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``bugfix-gym`` console script; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "play":
        from bugfix_gym.play import main as play_main

        return int(play_main(argv[1:], prog="bugfix-gym play") or 0)
    try:
        args = _parser().parse_args(argv)
        if args.command is None:
            _parser().print_help()
            return 2
        if args.command == "train" and args.resume is not None:
            given = [a for a in argv[1:] if a.startswith("--") and a not in ("--resume", "--no-progress")]
            if given:
                raise UsageError(f"bugfix-gym train: error: --resume continues a run with its own arguments; "
                                 f"drop {given[0]}")
        return cmd_train(args) if args.command == "train" else cmd_eval(args)
    except UsageError as e:
        print(str(e), file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("bugfix-gym: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
