"""The repair recipe on BugFix-v1 over seeds: train, then one table with the baselines on the same tasks.

    python benchmarks/repair_v1.py train --seeds 0 1 2            # bugfix-gym train --env BugFix-v1 per seed
    python benchmarks/repair_v1.py report                         # the table, the curves, the two-bug and pack rows
    python benchmarks/repair_v1.py analyse --model runs/repair_v1/ppo/seed-0/tokenppo.zip   # what it learned

``train`` runs ``bugfix-gym train --env BugFix-v1 --rl-only --seed S --out runs/repair_v1/<algo>/seed-S`` for
each seed not finished yet (one at a time by default: the recipe's minutes are per seed on one core), with any
further flags after ``--`` passed on. ``report`` reads every finished seed's ``results.json`` (the base agent and
the kept weights on the test split's evaluation tasks, four one-bug tasks per function), plays the scripted
debugger and brute force on the same tasks, evaluates each kept model on two-bug test tasks and on the
human-written pack, and writes ``runs/repair_v1/report.md`` and ``report.png`` (pass rate after k test calls:
models and baselines in one plot).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Sequence

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("runs") / "repair_v1"
PACKS = (ROOT / "examples" / "real_bugs_v1.json", ROOT / "examples" / "task_pack_v1_example.json")
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)


def train(seeds: Sequence[int], algo: str, extra: Sequence[str], name: str | None = None) -> None:
    """Each seed of ``algo`` (with the flags ``extra``) under ``runs/repair_v1/<name or algo>/seed-S``."""
    for seed in seeds:
        out = OUT / (name or algo) / f"seed-{seed}"
        if (out / "results.json").exists():
            print(f"{out}: done", flush=True)
            continue
        if out.exists():
            print(f"{out}: unfinished run folder; move it aside to train this seed again", flush=True)
            continue
        cmd = [sys.executable, "-u", "-m", "agents.cli", "train", "--env", "BugFix-v1", "--rl-only",
               "--seed", str(seed), "--algo", algo, "--out", str(out), "--no-progress", *extra]
        print(" ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)


def interval(xs: Sequence[float]) -> str:
    """``mean +- half-width of the 95% Student-t interval`` (``mean`` alone for one value)."""
    if len(xs) == 1:
        return f"{xs[0]:.3f}"
    half = T95[min(len(xs) - 1, len(T95)) - 1] * statistics.stdev(xs) / len(xs) ** 0.5
    return f"{statistics.mean(xs):.3f} ± {half:.3f}"


def report(algos: Sequence[str]) -> None:
    import torch

    from agents.algorithms.presets import load_algorithm
    from agents.bugfix.recipe_v1 import RepairRecipeV1
    from agents.bugfix.repair_v1 import tasks_per_function
    from agents.bugfix.v1 import baseline_v1, evaluate_v1, one_task_per_problem
    from bugfix_gym import load_task_pack
    from bugfix_gym.core.env_v1 import BugFixEnvV1

    torch.set_num_threads(1)
    runs = {algo: sorted((OUT / algo).glob("seed-*/results.json")) for algo in algos}
    runs = {a: [json.loads(p.read_text()) | {"dir": str(p.parent)} for p in ps] for a, ps in runs.items() if ps}
    if not runs:
        raise SystemExit(f"no finished run under {OUT}: run `python benchmarks/repair_v1.py train` first")
    recipe = RepairRecipeV1.from_dict(next(iter(runs.values()))[0]["settings"]["recipe"])
    tasks = tasks_per_function("test", recipe.eval_tasks, 1, seed=0)
    cache = OUT / "baselines.json"
    baselines = json.loads(cache.read_text()) if cache.exists() else {}
    for kind in ("debugger", "brute_force"):
        if kind not in baselines:
            print(f"playing {kind} on {len(tasks)} test tasks ...", flush=True)
            baselines[kind] = baseline_v1(kind, tasks, recipe.max_turns)
    cache.write_text(json.dumps(baselines))
    baselines = json.loads(cache.read_text())  # the k of pass_after_test_calls as JSON keys, like results.json's
    two_bug = tasks_per_function("test", 1, 2, seed=0)
    packs = {p.name: one_task_per_problem(BugFixEnvV1(tasks=load_task_pack(p)).tasks) for p in PACKS if p.exists()}
    lines = ["| player | seeds | test pass rate (one-bug) | calls | test calls | passed within 1 / 2 / 3 test calls "
             "| two-bug pass rate | " + " | ".join(packs) + " | minutes / seed |", "|---" * (8 + len(packs)) + "|"]
    for kind, stats in baselines.items():
        k = stats["pass_after_test_calls"]
        lines.append(f"| {kind} | - | {stats['pass_rate']:.3f} | {stats['mean_calls']:.2f} | "
                     f"{stats['mean_test_calls']:.2f} | {k['1']:.3f} / {k['2']:.3f} / {k['3']:.3f} | - | "
                     + " | ".join("-" for _ in packs) + " | - |")
    curves: dict[str, list[dict[str, float]]] = {kind: [s["pass_after_test_calls"]] for kind, s in baselines.items()}
    for algo, results in runs.items():
        for who in ("base", "trained", "base_greedy", "trained_greedy"):
            if not all(r.get(who) for r in results):  # greedy: runs from before it was evaluated have none
                continue
            rows = [r[who] for r in results]
            extra = {"two": [], **{name: [] for name in packs}}
            if who == "trained":
                for r in results:
                    model = load_algorithm(Path(r["dir"]) / "tokenppo.zip")
                    extra["two"].append(evaluate_v1(model, two_bug, 1, seed=r["seed"])["pass_rate"])
                    for name, pack_tasks in packs.items():
                        extra[name].append(evaluate_v1(model, pack_tasks, 8, seed=r["seed"])["pass_rate"])
            k = {n: interval([row["pass_after_test_calls"][str(n)] for row in rows]) for n in (1, 2, 3)}
            seeds = f"{len(rows)} seed{'s' if len(rows) > 1 else ''}"
            name = (f"{algo} (kept weights, {seeds})" if who.startswith("trained") else
                    f"base agent ({algo}'s runs, {seeds})") + (", greedy" if who.endswith("greedy") else "")
            lines.append(f"| {name} | {len(rows)} | {interval([row['pass_rate'] for row in rows])} | "
                         f"{statistics.mean(row['mean_calls'] for row in rows):.2f} | "
                         f"{statistics.mean(row['mean_test_calls'] for row in rows):.2f} | "
                         f"{k[1]} / {k[2]} / {k[3]} | "
                         + " | ".join(interval(extra[n]) if extra[n] else "-" for n in ("two", *packs)) + " | "
                         + (f"{statistics.mean(r['train_s'] for r in results) / 60:.1f}" if who == "trained" else "-")
                         + " |")
            curves[name] = [{str(n): v for n, v in row["pass_after_test_calls"].items()} for row in rows]
    text = "\n".join(lines)
    seeds = "; ".join(f"{a} seed {r['seed']}: base {r['base']['pass_rate']:.3f} -> {r['trained']['pass_rate']:.3f} "
                      f"(kept iteration {r['kept_iteration']} of {r['iterations']})" for a, rs in runs.items()
                      for r in rs)
    (OUT / "report.md").write_text(text + "\n\n" + seeds + "\n")
    print(text)
    print(seeds)
    _plot(curves, OUT / "report.png")
    print(f"wrote {OUT / 'report.md'} and {OUT / 'report.png'}")


def analyse(model_path: Path, n_transcripts: int = 2) -> None:
    """What a kept model does on the test split's evaluation tasks: how often it calls ``locate``, ``read`` and
    ``test``, whether its first edit is on ``locate``'s top line, which mutations it tries first, its pass rate per
    defect class, and a few failed episodes replayed as transcripts."""
    from collections import Counter

    import torch

    from agents.algorithms.presets import load_algorithm
    from agents.bugfix.recipe_v1 import RepairRecipeV1
    from agents.bugfix.repair_v1 import tasks_per_function
    from agents.bugfix.v1 import play_v1, summarise_v1
    from bugfix_gym.core.env_v1 import BugFixEnvV1
    from bugfix_gym.core.scripted_v1 import locate_scores

    torch.set_num_threads(1)
    results = json.loads((model_path.parent / "results.json").read_text())
    recipe = RepairRecipeV1.from_dict(results["settings"]["recipe"])
    model = load_algorithm(model_path)
    tasks = tasks_per_function("test", recipe.eval_tasks, 1, seed=0)
    trajs = play_v1(model, tasks, 1, seed=results["seed"], env_kwargs=dict(max_turns=recipe.max_turns))
    env = BugFixEnvV1(tasks=tasks, max_turns=recipe.max_turns)
    calls: Counter[str] = Counter()
    first_mutation: Counter[str] = Counter()
    on_top, first_edits, failed = 0, 0, []
    for task, traj in zip(tasks, trajs):
        actions = traj.info["actions"]
        calls.update({a.split()[0] if a.split() else "" for a in actions})
        obs, info = env.reset(options={"task": task})
        transcript, top = [obs], None
        for action in actions:
            obs, *_, info = env.step(action)
            transcript.append(f">>> {action}\n{obs}")
            if action.strip() == "locate" and top is None:
                scores = locate_scores(obs)
                top = max(scores, key=scores.get) if scores else None
        edits = [a for a in actions if a.startswith(("edit ", "delete "))]
        if edits:
            first_edits += 1
            words = edits[0].split()
            first_mutation[words[2] if words[0] == "edit" else "delete"] += 1
            line = int(words[1].split(".")[0])
            on_top += top is not None and line == top
        if not info.get("hidden_pass") and len(failed) < n_transcripts:
            failed.append((task.name, "\n".join(transcript)))
    n = len(trajs)
    stats = summarise_v1(tasks, 1, [t.info for t in trajs])
    print(f"{model_path}: {n} test tasks, pass rate {stats['pass_rate']:.3f}")
    print("share of episodes that call: " + ", ".join(f"{c} {calls[c] / n:.2f}" for c in
                                                      ("read", "test", "locate", "edit", "delete", "revert")))
    print(f"first edit on locate's top line: {on_top}/{first_edits} episodes with an edit")
    print("first edit's mutation: " + ", ".join(f"{m} {c}" for m, c in first_mutation.most_common(8)))
    print("pass rate per defect class: " + ", ".join(f"{k} {v['pass_rate']:.2f} ({v['episodes']})"
                                                     for k, v in stats["per_class"].items()))
    for name, text in failed:
        print(f"\n--- failed: {name}\n{text}")


def _plot(curves: dict[str, list[dict[str, float]]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    ks = [0, 1, 2, 3, 4, 5]
    for name, rows in curves.items():
        ys = [statistics.mean(float(row[str(k)]) for row in rows) for k in ks]
        ax.plot(ks, ys, "o-", label=name)
        if len(rows) > 1:
            lo = [min(float(row[str(k)]) for row in rows) for k in ks]
            hi = [max(float(row[str(k)]) for row in rows) for k in ks]
            ax.fill_between(ks, lo, hi, alpha=0.15)
    ax.set(xlabel="test calls (test and locate) allowed", ylabel="pass rate (bands: min-max over seeds)",
           title="BugFix-v1 test split, one-bug tasks, 12 calls")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("train", "report", "analyse"))
    p.add_argument("--model", type=Path, help="with analyse: a kept model (runs/repair_v1/ppo/seed-0/tokenppo.zip)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--algos", default="ppo", help="comma-separated --algo names (report: run folder names)")
    p.add_argument("--name", help="with train and one --algos name: the run folder's name under runs/repair_v1 "
                                  "(default the algorithm's), for runs with other flags after --")
    args = p.parse_args(argv)
    algos = [a for a in args.algos.split(",") if a]
    if args.name is not None and (args.what != "train" or len(algos) != 1):
        p.error("--name goes with train and one --algos name")
    if args.what == "train":
        for algo in algos:
            train(args.seeds, algo, extra, args.name)
    elif args.what == "analyse":
        if args.model is None:
            p.error("analyse needs --model")
        analyse(args.model)
    else:
        report(algos)
    return 0


if __name__ == "__main__":
    sys.exit(main())
