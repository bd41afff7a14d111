"""``bugfix-gym train``: start a run (or resume one), train it, report it.

A run lives in a folder: ``run.json`` (its settings), the model, ``resume.json`` while it is
unfinished, and at the end ``results.json`` and ``learning_curve.png``.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agents.cli.flags import program, usage_error
from agents.cli.report import (before_after, eval_sets, jsonable, load_earlier_curve, plot_learning_curve,
                               save_earlier_curve, table)
from agents.cli.settings import train_settings

if TYPE_CHECKING:
    from agents.bugfix.callbacks import KeepBest
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm


@dataclasses.dataclass
class TrainingRun:
    """A run being trained.

    :param out: its folder
    :param settings: its settings (``run.json``)
    :param model: the algorithm being trained (TokenPPO or Reinforce, as ``--algo`` says)
    :param before: the base agent's results per task set (None for a resumed run)
    :param resumed: continued with ``--resume``
    :param train_s: seconds spent in ``learn`` (set by :func:`train`)
    """

    out: Path
    settings: dict[str, Any]
    model: TokenOnPolicyAlgorithm
    before: dict[str, dict[str, float]] | None
    resumed: bool
    train_s: float = 0.0
    dump: Path | None = None
    lock: Any = None


def cmd_train(args: argparse.Namespace) -> int:
    """Start (or resume) a run, train it, report it; returns the exit status.

    :param args: ``bugfix-gym train``'s parsed command line
    """
    if args.print_config:
        print(json.dumps(train_settings(args), indent=1))
        return 0
    import torch

    torch.set_num_threads(1)  # a ~150k-parameter model: one thread beats two on a small, shared CPU
    started = time.perf_counter()
    lock = lock_run(args.resume) if args.resume is not None else None  # one command per run folder at a time
    try:
        run = resume_run(args.resume) if args.resume is not None else start_run(args, started)
        lock = lock or run.lock or lock_run(run.out)
        keep_best = _keep_best(run)
        status = train(run, keep_best, progress=not args.no_progress)
        if status is not None:  # interrupted or diverged: the last finished iteration is saved
            return status
        report(run, keep_best, started)
        return 0
    finally:
        if lock is not None:
            lock.release()


# ---------------------------------------------------------------------- start / resume
def start_run(args: argparse.Namespace, started: float) -> TrainingRun:
    """A new run: its settings checked, its folder made, the algorithm built on the base agent, which is evaluated.

    :param args: the parsed command line
    :param started: ``time.perf_counter()`` when the command started
    """
    from agents.files.runs import RUN_FILE, new_run_dir

    settings = train_settings(args)
    if args.dump is not None:
        check_dump(args.dump)
    lock = None
    if args.out is not None:
        check_out(args.out)
        lock = lock_run(args.out)  # before anything is written: a second run on the folder refuses here
    try:
        if args.out is not None and (args.out / RUN_FILE).exists():  # under the lock: no run started meanwhile
            raise usage_error("train", f"{args.out} already holds a run; continue it with --resume {args.out} or "
                                       "choose another --out")
        print("setting up: base agent (behaviour cloning, cached after the first run) ...", flush=True)
        env = make_env(settings, settings["n_envs"], settings["seed"])
        model = _new_model(settings, env)
        out = args.out or new_run_dir()
        if settings["tensorboard"]:
            model.tensorboard_log = str(out / "tb")
        write_run_file(out / RUN_FILE, json.dumps(settings, indent=1))
        model.first_update_dump = args.dump
        print(f"  ready in {time.perf_counter() - started:.0f} s; evaluating the base agent ...", flush=True)
        before = _evaluate(model, settings)
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return TrainingRun(out, settings, model, before=before, resumed=False, dump=args.dump, lock=lock)


def write_run_file(path: Path, text: str) -> None:
    """A run folder's JSON file written as a regular file, never through a link planted at its name; a write
    error is one line.

    :param path: the file (``run.json``, ``results.json``)
    :param text: its content
    """
    from agents.files.checkpoint import why_not_writable, write_regular

    try:
        write_regular(path, text.encode("utf-8"))
    except OSError as e:
        raise usage_error("train", f"cannot write {path} ({why_not_writable(e)})") from None


def _new_model(settings: dict[str, Any], env: Any) -> TokenOnPolicyAlgorithm:
    """The run's algorithm (``algo``, TokenPPO for a run without one) on ``env`` from the recipe's
    tokenizer, call grammar and base agent, memory checked first.

    :param settings: the run's settings
    :param env: the training vec env
    """
    from agents.algorithms.ppo import TokenPPO
    from agents.algorithms.presets import get_preset, make_algorithm
    from agents.bugfix import recipes
    from agents.model.tinyagent import TinyAgentConfig

    tok = recipes.make_tokenizer(settings)
    policy_kwargs: dict[str, Any] = {"tokenizer": tok}
    if settings["grammar"]:
        from bugfix_gym import CALLS
        policy_kwargs["call_grammar"] = list(CALLS)
        policy_kwargs["call_mask_key"] = settings.get("call_mask")
        policy_kwargs["foresight"] = settings.get("rollout_foresight") or settings.get("foresight")
        if settings.get("rollout_foresight"):  # --rl-only: foresight teaches in training, the model decodes without
            policy_kwargs["foresight_teach"] = True
    check_memory(settings, dataclasses.asdict(TinyAgentConfig(vocab_size=tok.vocab_size)))  # before any work
    base_agent = recipes.base_agent(settings, tok, settings["seed"], verbose=1)
    algo = settings.get("algo", "ppo")
    ppo = settings["ppo"]
    kwargs = recipes.ppo_kwargs(ppo) if get_preset(algo).cls is TokenPPO else dict(ppo)
    model = make_algorithm(algo, "TinyAgentPolicy", env, seed=settings["seed"], policy_kwargs=policy_kwargs,
                           base_agent=base_agent, tensorboard_log=None, **kwargs)
    set_lr_schedule(model, settings)
    check_memory(settings, model.policy_kwargs["model_config"])  # the sizes the base agent brought
    return model


def resume_run(out: Path) -> TrainingRun:
    """The run in ``out``, stopped by Ctrl-C: its model and training state, with its own settings.

    :param out: the run's folder (``--resume``)
    """
    from agents.algorithms.presets import load_algorithm
    from agents.bugfix import aux_losses  # noqa: F401 (registers the upgrade of older files' settings)
    from agents.files import runs
    from bugfix_gym.contract.text import printable

    try:
        settings, resume_state = runs.read_run_file(out / runs.RUN_FILE), runs.read_run_file(out / runs.RESUME_FILE)
        runs.check_run_settings(settings)
        runs.check_resume_state(resume_state)
    except (OSError, ValueError) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else printable(str(e), 200)
        raise usage_error("train", f"{out} is not a run that can be resumed ({why}: it needs {runs.RUN_FILE} and "
                                   f"{runs.RESUME_FILE} as written by bugfix-gym train)") from None
    try:
        env = make_env(settings, settings["n_envs"], settings["seed"])
        model = load_algorithm(out / runs.MODEL_FILE, env=env,
                               tensorboard_log=str(out / "tb") if settings["tensorboard"] else None)
        runs.restore_training_state(model, resume_state)
    except FileNotFoundError as e:
        raise usage_error("train", printable(str(e), 300)) from None
    except (KeyError, TypeError, ValueError, IndexError, OverflowError, RuntimeError) as e:  # torch's generator
        raise usage_error("train", f"{out} holds a damaged run ({type(e).__name__}: "
                                   f"{printable(str(e).splitlines()[0] if str(e) else '', 200)}); start a new run"
                          ) from None
    set_lr_schedule(model, settings)
    check_memory(settings, model.policy_kwargs["model_config"])
    print(f"resuming {out} at iteration {model.iteration} ({model.num_timesteps} env steps done)", flush=True)
    return TrainingRun(out, settings, model, before=None, resumed=True)


# ---------------------------------------------------------------------- train
def train(run: TrainingRun, keep_best: KeepBest | None, progress: bool) -> int | None:
    """Train to the end of the run's budget. Ctrl-C (exit status 130) or a diverged update (1) saves
    the last finished iteration and returns the exit status; a finished run returns None.

    :param run: the run, its ``train_s`` set here
    :param keep_best: the validation callback (:func:`_keep_best`), or None
    :param progress: show a progress bar (with an env-step budget)
    """
    from agents.algorithms.callbacks import StopAfterIterations
    from agents.algorithms.first_update_dump import DumpWriteError
    from agents.algorithms.ppo import DivergenceError
    from agents.files.runs import Snapshots
    from agents.files.stops import StopRequested, exit_status, ignore_stop_signals, stop_signals_interrupt

    model, settings, out = run.model, run.settings, run.out
    snapshots = Snapshots()
    callbacks: list[Any] = [snapshots]
    if settings.get("iterations"):  # the book counts iterations; SB3's loop then runs until the callback stops it
        remaining, unit = settings["iterations"] - model.iteration, "iterations"
        callbacks.append(StopAfterIterations(remaining))
        total_timesteps = 10**12
    else:
        remaining, unit = settings["timesteps"] - model.num_timesteps, "env steps"
        total_timesteps = remaining
    callbacks += [keep_best] if keep_best is not None else []
    started = time.perf_counter()
    print(f"training {_name(model, settings)} for {remaining} {unit} ({settings['n_envs']} envs, at least "
          f"{model.config.n_episodes} episodes per iteration) ...", flush=True)
    try:
        with stop_signals_interrupt():  # SIGTERM and SIGHUP save like Ctrl-C
            model.learn(total_timesteps, callback=callbacks, progress_bar=progress and unit == "env steps",
                        reset_num_timesteps=not run.resumed)
    except KeyboardInterrupt as stop:
        ignore_stop_signals()  # a second Ctrl-C must not cut the save short
        path = snapshots.save(out) if snapshots.last is not None else None
        if path:  # the model file keeps no curve: a resumed run's plot joins this one
            save_earlier_curve(out, model.diagnostics, snapshots.iteration)
        saved = f"saved iteration {snapshots.iteration} to {path}" if path else "nothing to save yet"
        print(f"\nbugfix-gym: interrupted ({stop.args[0] if isinstance(stop, StopRequested) else 'Ctrl-C'}); "
              f"{saved}; continue with: {program()} train --resume {out}", file=sys.stderr)
        return exit_status(stop)
    except DivergenceError as e:
        path = snapshots.save(out) if snapshots.last is not None else None
        print(f"bugfix-gym: {e}. Kept the last good iteration ({snapshots.iteration}) in {path}", file=sys.stderr)
        return 1
    except DumpWriteError as e:  # at the first update, before its first step: nothing was trained yet
        raise usage_error("train", f"{e}; the run stopped before its first update: free space or choose another "
                                   "--dump") from None
    run.train_s = time.perf_counter() - started
    _say_dump(run)
    return None


def _say_dump(run: TrainingRun) -> None:
    """After training with ``--dump``: how to check the dump, or why there is none."""
    if run.model.first_update_dump is not None:
        print(f"bugfix-gym train: --dump: no update ran (the budget ended before the first batch was complete); "
              f"nothing written to {run.dump}", file=sys.stderr)
    elif run.dump is not None:
        from agents.algorithms.first_update_dump import tokenizer_path

        print(f"wrote the first update's conformance dump to {run.dump}; check it with: {program()} conformance "
              f"{run.dump} --end-ids {run.model.policy.tokenizer.eoc_id} --tokenizer {tokenizer_path(run.dump)}",
              flush=True)


def _keep_best(run: TrainingRun) -> KeepBest | None:
    """The callback that evaluates on the validation tasks every few iterations and keeps the best
    weights (or the mean of the latest ones) as the result; None for a recipe without validation.

    :param run: the run
    """
    from agents.bugfix.callbacks import KeepBest
    from agents.bugfix import recipes
    from agents.bugfix.evaluation import evaluate

    settings = run.settings
    if not settings.get("validation"):
        return None
    return KeepBest(recipes.validation_tasks(settings), every=settings["validation"]["every"],
                    seed=settings["seed"], env_kwargs=eval_env(settings),
                    average_last=settings["validation"].get("average_last"),
                    save_dir=run.out / "evaluated" if settings.get("save_evaluated") else None,
                    evaluate=functools.partial(evaluate, **saved_decoding(settings)))


# ---------------------------------------------------------------------- report
def report(run: TrainingRun, keep_best: KeepBest | None, started: float) -> None:
    """Save the trained model, evaluate it, print the before/after table, write the learning curve
    and ``results.json``.

    :param run: the trained run
    :param keep_best: the validation callback, or None
    :param started: ``time.perf_counter()`` when the command started
    """
    from agents.algorithms.presets import trained_by
    from agents.files.runs import MODEL_FILE

    model, settings, out = run.model, run.settings, run.out
    validation = _report_validation(keep_best, settings)
    if saved_decoding(settings):  # the model is saved (and evaluated) decoding as validation chose it
        model.policy.foresight = None
        model.policy_kwargs.update(foresight=None, foresight_teach=False)
    model_path = out / MODEL_FILE
    save_final(model, out)
    after = _evaluate(model, settings)
    print(f"\n{model.iteration} iterations, {model.num_timesteps} env steps, {model.total_policy_tokens} policy "
          f"tokens in {run.train_s:.0f} s\n")
    print(table(before_after(run.before, after)))
    png = out / "learning_curve.png"
    diagnostics = load_earlier_curve(out) + model.diagnostics
    plot_learning_curve(diagnostics, png,
                        f"{_name(model, settings)} on BugFix-v0 ({settings['tasks']} tasks, seed {settings['seed']})",
                        validation=keep_best.history if keep_best is not None else None,
                        base_pass_rate=next(iter(run.before.values()))["pass_rate"] if run.before else None,
                        kept=_kept_iterations(keep_best))
    results = {"algo": settings.get("algo", "ppo"), "trained_by": trained_by(model), "before": run.before,
               "after": after, "train_s": run.train_s,
               "validation": validation, "curve": learning_curve(diagnostics), "settings": settings}
    write_run_file(out / "results.json", json.dumps(jsonable(results), indent=1))
    print(f"\nsaved {model_path}, {png} and {out / 'results.json'}  (total {time.perf_counter() - started:.0f} s)")
    print(f"evaluate again with: {program()} eval {model_path} --generated test --n 200")


def _kept_iterations(keep_best: KeepBest | None) -> int | list[int] | None:
    """The iteration whose weights validation kept, or the iterations it averaged (None: no validation)."""
    if keep_best is None:
        return None
    return keep_best.averaged_iterations or keep_best.best_iteration


def _name(model: TokenOnPolicyAlgorithm, settings: dict[str, Any]) -> str:
    """The algorithm in words: its class, and the ``--algo`` name when that is not the class's own."""
    algo = settings.get("algo", "ppo")
    return type(model).__name__ + ("" if algo in ("ppo", "reinforce") else f" ({algo})")


def learning_curve(diagnostics: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One entry per iteration of ``model.diagnostics``: ``iteration``, ``num_timesteps`` and the batch's
    ``pass_rate`` and ``valid_calls`` (None where the rollout did not say)."""
    return [dict(iteration=entry["iteration"], num_timesteps=entry.get("num_timesteps"),
                 pass_rate=entry.get("rollout", {}).get("pass_rate"),
                 valid_calls=entry.get("rollout", {}).get("valid_calls")) for entry in diagnostics]


def _report_validation(keep_best: KeepBest | None, settings: dict[str, Any]) -> dict[str, Any] | None:
    """Print which weights validation kept; return what ``results.json`` records of it (None: no validation).

    :param keep_best: the validation callback after training, or None
    :param settings: the run's settings
    """
    if keep_best is None:
        return None
    val = settings["validation"]
    on = f"{len(keep_best.history)} evaluations on {val['n']} generated {val['generated']} tasks"
    if keep_best.averaged_iterations:
        first, last = keep_best.averaged_iterations[0], keep_best.averaged_iterations[-1]
        print(f"kept the mean of the weights of iterations {first}-{last} ({len(keep_best.averaged_iterations)} "
              f"of {on}): validation pass rate {keep_best.average_pass_rate:.3f} (best single weights "
              f"{keep_best.best_pass_rate:.3f}, iteration {keep_best.best_iteration})")
        return dict(averaged_iterations=keep_best.averaged_iterations,
                    average_pass_rate=keep_best.average_pass_rate, history=keep_best.history)
    print(f"kept the weights of iteration {keep_best.best_iteration}: validation pass rate "
          f"{keep_best.best_pass_rate:.3f} (best of {on})")
    return dict(kept_iteration=keep_best.best_iteration, history=keep_best.history)


def _evaluate(model: TokenOnPolicyAlgorithm, settings: dict[str, Any]) -> dict[str, dict[str, float]]:
    """The model's results on each task set of the before/after table.

    :param model: the algorithm
    :param settings: the run's settings
    """
    from agents.bugfix.evaluation import evaluate

    return {name: evaluate(model, tasks, k, seed=settings["seed"], env_kwargs=eval_env(settings),
                           **saved_decoding(settings))
            for name, (tasks, k) in eval_sets(settings["tasks"], settings["eval_episodes"]).items()}


def saved_decoding(settings: dict[str, Any]) -> dict[str, Any]:
    """How the saved model decodes where training rolls out otherwise (``--rl-only``: without the
    foresight that teaches in training), as :func:`agents.bugfix.evaluation.evaluate` overrides; {}: as trained.

    :param settings: the run's settings
    """
    return dict(foresight=None) if settings.get("rollout_foresight") else {}


# ---------------------------------------------------------------------- the run's envs, memory and folder
def make_env(settings: dict[str, Any], n_envs: int, seed: int) -> Any:
    """The training vec env: ``n_envs`` BugFix-v0 envs with the run's env options.

    :param settings: the run's settings
    :param n_envs: number of envs
    :param seed: the envs' seed
    """
    from stable_baselines3.common.env_util import make_vec_env

    import bugfix_gym  # noqa: F401  (registers BugFix-v0)

    return make_vec_env("BugFix-v0", n_envs=n_envs, seed=seed, env_kwargs=dict(settings["env"], render_mode=None))


def eval_env(settings: dict[str, Any]) -> dict[str, Any] | None:
    """The env options that evaluation shares with training: blanked tool outputs, if any."""
    hidden = settings["env"].get("hide_outputs")
    return dict(hide_outputs=hidden) if hidden else None


def set_lr_schedule(model: TokenOnPolicyAlgorithm, settings: dict[str, Any]) -> None:
    """The recipe's learning-rate schedule: ``"linear"`` decays ``ppo.learning_rate`` to 0 over the run's env
    steps (SB3's ``LinearSchedule`` of the progress remaining); ``"constant"`` (or none) keeps it."""
    if (settings.get("lr_schedule") or "constant") == "constant":
        return
    from stable_baselines3.common.utils import LinearSchedule

    model.learning_rate = LinearSchedule(settings["ppo"]["learning_rate"], 0.0, 1.0)
    model._setup_lr_schedule()


def check_memory(settings: dict[str, Any], model_config: dict[str, Any]) -> None:
    """Refuse a run that needs over 80% of the memory available (warn above 50%).

    :param settings: the run's settings
    :param model_config: the TinyAgent config (``max_len``, ``d_model``, ``n_layer``, ``vocab_size``)
    """
    from agents.files.runs import available_memory_bytes, estimate_memory_bytes

    ppo = settings["ppo"]
    need = estimate_memory_bytes(ppo["n_episodes"], settings["n_envs"], model_config["max_len"],
                                 model_config["d_model"], model_config["n_layer"], model_config["vocab_size"],
                                 math.ceil(ppo["n_episodes"] / ppo.get("n_minibatches", 1)))
    have = available_memory_bytes()
    if have is None:
        return
    if need > 0.8 * have:
        raise usage_error("train", f"this run needs about {need / 2**30:.1f} GiB of memory but "
                                   f"{have / 2**30:.1f} GiB is available; lower --n-episodes or --n-envs")
    if need > 0.5 * have:
        print(f"warning: this run needs about {need / 2**30:.1f} GiB of the {have / 2**30:.1f} GiB available",
              file=sys.stderr)


def save_final(model: TokenOnPolicyAlgorithm, out: Path) -> None:
    """Write the trained model atomically and drop ``resume.json``, with stop signals held back: a failed
    write (a full disk, a quota) keeps the last snapshot and is one line.

    :param model: the trained model
    :param out: the run's folder
    """
    from agents.files.checkpoint import atomic_write
    from agents.files.runs import MODEL_FILE, RESUME_FILE
    from agents.files.stops import signals_deferred

    try:
        with signals_deferred():
            atomic_write(out / MODEL_FILE, model.save)
            (out / RESUME_FILE).unlink(missing_ok=True)
    except OSError as e:
        raise usage_error("train", f"cannot write the trained model to {out / MODEL_FILE} "
                                   f"({e.strerror or type(e).__name__}); the last snapshot is kept: free "
                                   f"space and continue with --resume {out}") from None


def lock_run(out: Path) -> Any:
    """Hold the run folder's lock (:class:`agents.files.stops.RunLock`) for the rest of the command;
    a second command on the same folder gets one line. A folder that is not there is left to the
    command's own checks (None).

    :param out: the run's folder
    """
    from agents.files.stops import RunLock

    if not out.is_dir():
        return None
    try:
        return RunLock(out)
    except BlockingIOError:
        raise usage_error("train", f"another bugfix-gym train is using {out}; wait until it ends") from None
    except OSError as e:
        raise usage_error("train", f"cannot lock {out} ({e.strerror or type(e).__name__})") from None


def check_dump(path: Path) -> None:
    """``--dump`` must name a regular file that can be written (its folder is made if missing), and the tokenizer
    file written next to it (``DUMP.tokenizer.json``) must not be a link or anything but a regular file: a link
    at either name is refused, not written through.

    :param path: the dump file given
    """
    import stat

    from agents.algorithms.first_update_dump import tokenizer_path
    from agents.files.checkpoint import why_not_writable, write_regular

    if path.is_dir() and not path.is_symlink():
        raise usage_error("train", f"--dump {path} is a folder; give a file, e.g. {path / 'dump.jsonl'}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_regular(path, b"")
    except OSError as e:
        raise usage_error("train", f"--dump {path} cannot be written ({why_not_writable(e)}); choose another "
                                   "file") from None
    beside = tokenizer_path(path)
    try:
        mode = beside.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as e:
        raise usage_error("train", f"--dump's tokenizer file {beside} cannot be checked ({e.strerror}); choose "
                                   "another --dump") from None
    if not stat.S_ISREG(mode):
        raise usage_error("train", f"--dump writes the tokenizer to {beside}, which is a link or not a regular "
                                   "file; remove it or choose another --dump")


def check_out(out: Path) -> None:
    """``--out`` must be a writable folder that holds no run yet (it is made if missing); the run folder's lock is
    taken next, before anything is written (:func:`start_run`).

    :param out: the output folder given
    """
    if out.exists() and not out.is_dir():
        raise usage_error("train", f"--out {out} is a file, not a folder")
    if out.exists() and (out / "run.json").exists():
        raise usage_error("train", f"{out} already holds a run; continue it with --resume {out} or choose another "
                                   "--out")
    import os
    import tempfile

    try:
        out.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=out, prefix=".write-test")  # a new name (O_EXCL): never a planted link
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise usage_error("train", f"cannot write to {out} ({e.strerror or type(e).__name__})") from None
