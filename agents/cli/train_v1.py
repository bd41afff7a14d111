"""``bugfix-gym train --env BugFix-v1 --rl-only``: one seed of the repair recipe (:mod:`agents.bugfix.recipe_v1`).

The run's folder gets ``run.json`` (the recipe, the algorithm, the seed), ``model.zip`` (the weights validation
kept), ``results.json`` (the base agent and the trained model on the test split, validation history, learning
curve, wall time) and ``learning_curve.png``. Every flag is a field of :class:`RepairRecipeV1` (``--base-steps``
and the other ``--base-`` flags are its base agent's), so ``--print-config`` shows every setting the run uses.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from agents.cli.flags import (NON_NEGATIVE_FLOAT, NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, OneLineParser,
                              program, usage_error)

V1_ENV = "BugFix-v1"
_NUMBERS = {int: POSITIVE_INT, float: POSITIVE_FLOAT}
_ZERO_OK = {"ent_coef": NON_NEGATIVE_FLOAT, "kl_coef": NON_NEGATIVE_FLOAT, "seed": NON_NEGATIVE_INT,
            "base_seed": NON_NEGATIVE_INT, "base_weight_decay": NON_NEGATIVE_FLOAT}


def wants_v1(argv: Sequence[str]) -> bool:
    """Whether a ``train`` command line asks for BugFix-v1 (``--env BugFix-v1`` or ``--env=BugFix-v1``)."""
    argv = list(argv)
    for i, arg in enumerate(argv):
        if arg == "--env" and i + 1 < len(argv):
            return argv[i + 1] == V1_ENV
        if arg.startswith("--env="):
            return arg.split("=", 1)[1] == V1_ENV
    return False


def build_parser() -> argparse.ArgumentParser:
    """The v1 train parser: the run's own flags, then one flag per recipe field."""
    from agents.algorithms.presets import ALGORITHM_NAMES
    from agents.bugfix.recipe_v1 import RepairRecipeV1

    p = OneLineParser(prog="bugfix-gym train --env BugFix-v1",
                      description="RL-only repair on BugFix-v1: the v1 base agent (the scripted debugger, "
                                  "behaviour-cloned on train-split functions), then --algo on train-split tasks; "
                                  "held-out validation keeps the best iteration; the test split is evaluated at "
                                  "the end, base agent and trained model side by side (docs/repair.md)")
    p.add_argument("--env", choices=(V1_ENV,), required=True, help="BugFix-v1 (this command)")
    p.add_argument("--rl-only", action="store_true",
                   help="decode under the legal-call grammar only, in training, validation and evaluation (the "
                        "only decoding on BugFix-v1: the flag is accepted and implied)")
    p.add_argument("--seed", type=_ZERO_OK["seed"], default=0, help="seeds the base agent, envs and sampling")
    p.add_argument("--out", type=Path, default=None, help="the run's folder (default: a new runs/v1-<time>)")
    p.add_argument("--algo", choices=ALGORITHM_NAMES, default="ppo", metavar="NAME",
                   help=f"the algorithm: {', '.join(ALGORITHM_NAMES)} (default ppo)")
    p.add_argument("--print-config", action="store_true", help="print every setting as JSON and exit")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    doc = _field_docs(RepairRecipeV1)
    defaults = RepairRecipeV1()
    for field in dataclasses.fields(RepairRecipeV1):
        if field.name == "base":
            for sub in dataclasses.fields(defaults.base):
                _add_field(p, f"base_{sub.name}", sub.type, getattr(defaults.base, sub.name),
                           f"the base agent's {sub.name}")
        else:
            _add_field(p, field.name, field.type, getattr(defaults, field.name), doc.get(field.name, ""))
    return p


def _field_docs(cls: type) -> dict[str, str]:
    """``:param name: text`` of a class docstring, by name."""
    out: dict[str, str] = {}
    name = None
    for line in (cls.__doc__ or "").splitlines():
        line = line.strip()
        if line.startswith(":param "):
            name, _, text = line[len(":param "):].partition(":")
            out[name] = text.strip()
        elif name and line:
            out[name] += " " + line
    return out


def _add_field(p: argparse.ArgumentParser, name: str, kind: Any, default: Any, text: str) -> None:
    kind = {"int": int, "float": float, "str": str, "bool": bool}.get(kind, kind) if isinstance(kind, str) else kind
    flag = "--" + name.replace("_", "-")
    if kind is str:
        choices = ("bpe", "byte") if name == "tokenizer" else None
        p.add_argument(flag, choices=choices, default=None, help=f"{text} (default {default})")
    elif kind is bool:  # --flag / --no-flag
        p.add_argument(flag, action=argparse.BooleanOptionalAction, default=None, help=f"{text} (default {default})")
    else:
        p.add_argument(flag, type=_ZERO_OK.get(name, _NUMBERS.get(kind, kind)), default=None,
                       help=f"{text} (default {default})")


def recipe_from(args: argparse.Namespace) -> Any:
    """The recipe with the flags given; a bad combination is a one-line error."""
    from agents.bugfix.recipe_v1 import RepairRecipeV1, with_changes

    names = [f.name for f in dataclasses.fields(RepairRecipeV1) if f.name != "base"]
    names += [f"base_{f.name}" for f in dataclasses.fields(RepairRecipeV1().base)]
    changes = {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}
    try:
        return with_changes(RepairRecipeV1(), **changes)
    except (TypeError, ValueError) as e:
        raise usage_error("train", str(e)) from None


def settings_of(args: argparse.Namespace) -> dict[str, Any]:
    """``run.json``: the env, the algorithm, the seed, the decoding, the whole recipe and every setting of the
    algorithm (``ppo``: its class's defaults, its preset's, then the recipe's batch, learning rate and passes)."""
    recipe = recipe_from(args)
    try:
        trained = recipe.trained_settings(args.algo)
    except ValueError as e:  # a recipe setting the algorithm cannot take (kl_coef without a reference policy)
        raise usage_error("train", str(e)) from None
    return dict(env=V1_ENV, algo=args.algo, seed=args.seed, decoding="legal-call grammar", foresight=None,
                call_mask="legal_calls", recipe=dataclasses.asdict(recipe), ppo=trained)


def cmd_train_v1(argv: Sequence[str]) -> int:
    """Parse ``argv`` (after ``train``), train one seed, write the run folder; returns the exit status."""
    args = build_parser().parse_args(list(argv))
    settings = settings_of(args)
    if args.print_config:
        print(json.dumps(settings, indent=1))
        return 0
    import torch

    from agents.bugfix.repair_v1 import train_repair
    from agents.cli.train import check_out, write_run_file
    from agents.files.runs import MODEL_FILE, new_run_dir

    torch.set_num_threads(1)
    if args.out is not None:
        check_out(args.out)
        if (args.out / "run.json").exists():
            raise usage_error("train", f"{args.out} already holds a run; choose another --out")
    out = args.out or new_run_dir()
    out.mkdir(parents=True, exist_ok=True)
    write_run_file(out / "run.json", json.dumps(settings, indent=1))
    started = time.perf_counter()
    recipe = recipe_from(args)
    print(f"BugFix-v1 repair: {args.algo}, seed {args.seed}, at most {recipe.minutes:g} min of training; "
          f"setting up the base agent (cached after the first run) ...", flush=True)
    try:
        model, result = train_repair(recipe, args.algo, args.seed, verbose=1 if args.no_progress else 2)
    except KeyboardInterrupt:
        print(f"\nbugfix-gym: interrupted while setting up or evaluating; nothing kept in {out} (a v1 run does not "
              "resume yet; an interrupt during training keeps validation's best weights)", file=sys.stderr)
        return 130
    model.save(out / MODEL_FILE)
    results = dict(dataclasses.asdict(result), total_s=time.perf_counter() - started, settings=settings)
    write_run_file(out / "results.json", json.dumps(_jsonable(results), indent=1))
    _plot(result, out / "learning_curve.png", f"{args.algo} on BugFix-v1, seed {args.seed}")
    print(_summary(result))
    if result.interrupted:
        print("(training was interrupted: these are the weights validation kept before the interrupt)")
    print(f"\nsaved {out / MODEL_FILE} and {out / 'results.json'}  (total {results['total_s'] / 60:.1f} min)")
    print(f"evaluate again with: {program()} eval {out / MODEL_FILE} --env BugFix-v1 --split test --json")
    return 0


def _summary(result: Any) -> str:
    trained = f"trained ({result.algo}, iteration {result.kept_iteration})"
    rows = [("base agent", result.base), (trained, result.trained)]
    if result.base_greedy is not None and result.trained_greedy is not None:
        rows += [("base agent, greedy", result.base_greedy), (f"{trained}, greedy", result.trained_greedy)]
    lines = [f"{result.iterations} iterations, {result.env_steps} env steps in {result.train_s / 60:.1f} min; "
             f"test split, {result.trained['episodes']} one-bug tasks:",
             f"  {'':<32} {'pass rate':>9} {'calls':>6} {'test calls':>10}"]
    for name, stats in rows:
        lines.append(f"  {name:<32} {stats['pass_rate']:>9.3f} {stats['mean_calls']:>6.2f} "
                     f"{stats['mean_test_calls']:>10.2f}")
    return "\n".join(lines)


def _plot(result: Any, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    curve = [(c["iteration"], c["pass_rate"]) for c in result.curve if c.get("pass_rate") is not None]
    if curve:
        ax.plot(*zip(*curve), label="train batches", color="tab:blue", alpha=0.6)
    if result.validation:
        ax.plot(*zip(*result.validation), "o-", label="held-out validation", color="tab:orange")
    ax.axhline(result.trained["pass_rate"], ls="--", color="tab:green", label="test (kept weights)")
    ax.axhline(result.base["pass_rate"], ls=":", color="gray", label="test (base agent)")
    ax.set(xlabel="iteration", ylabel="pass rate", title=title, ylim=(0, 1))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _jsonable(x: Any) -> Any:
    from agents.cli.report import jsonable

    return jsonable(x)
