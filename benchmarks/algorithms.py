"""The seeded algorithm table: every ``--algo`` name trained with the same budget from the same base
agent, on each protocol, each run a ``bugfix-gym train`` of its own.

    python benchmarks/algorithms.py                          # book and generalisation, 2 runs at a time
    python benchmarks/algorithms.py --protocol book --seeds 5 --algos ppo,grpo,rloo
    python benchmarks/algorithms.py --protocol v1            # BugFix-v1: 5 names x 3 seeds, 25 min each
    python benchmarks/algorithms.py --report                 # only re-read runs/algorithms/ and write the table

On BugFix-v0 every run is ``--preset-only``: the recipe of ``--tasks`` gives the tasks, the env, the base agent
and the budget; the ``--algo`` preset (on its class's defaults) gives every algorithm setting, and the recipe's
additions to the loss (the generated recipe's KL, entropy bonus, tool-output loss and edit practice) are off
for every row, so each row is the algorithm it names. A run's ``run.json`` is checked against those settings.

Protocols:

* **book**: ``--tasks book`` (the book's 20 train tasks, the book's base agent); reported: train and
  held-out pass rates after training.
* **generalisation**: ``--tasks generated --foresight none --call-mask call_mask``: generated train
  templates, decoding under the legal-call grammar only (no foresight, no useful-call mask);
  reported: the unseen test templates (200 tasks, generator seed 0, one episode each, the run's own
  table) and the example task pack (``bugfix-gym eval --pack``).
* **generalisation-100k**: the same at the recipe's own budget, 100,000 env steps (not run by default).
* **v1**: ``bugfix-gym train --env BugFix-v1 --rl-only``: the v1 repair recipe (HumanEval functions, real bug
  classes, decoding under the legal-call grammar only) from its base agent, its wall-clock budget (``--minutes``,
  25 by default) per run; every name gets the preset's algorithm settings and the recipe's batch, learning rate
  and passes (no KL, entropy or other loss the recipe adds); reported: the test split's one-bug tasks (four per
  function, one episode each) and the human-written pack ``examples/real_bugs_v1.json`` (two episodes per bug).
  Run by ``--protocol v1`` only, for ``ppo,grpo,dr_grpo,reinforce_pp,gigpo`` unless ``--algos`` names others.

Each run's folder is ``runs/algorithms/<protocol>/<algo>/<digest>/seed-<S>``, the digest that of the
run's flags and algorithm settings; a run whose ``results.json`` exists is not run again, so an interrupted
table resumes where it stopped, and a changed preset or protocol starts new folders. The table
(``runs/algorithms/table.md``, also printed) gives per cell the mean over seeds and a 95% Student-t
interval, the wall and training time per run, the env steps at which the rollouts' train pass rate first
reached 0.8 (mean over the seeds that reached it, and how many did), and on how many seeds validation kept
iteration 0, the base agent's own weights (no later iteration validated better); ``learning_curves.png``
plots the rollouts' pass rate against env steps, the mean over seeds with a band from the lowest
to the highest seed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
OUT = Path("runs") / "algorithms"
PACK = ROOT / "examples" / "task_pack_example.json"
PACK_V1 = ROOT / "examples" / "real_bugs_v1.json"
#: every protocol trains each name with ``--preset-only``: the recipe gives the tasks, env, base agent and budget,
#: the preset (and its class's defaults) every algorithm setting; the recipe's additions to the loss (the
#: generated recipe's KL 0.05, entropy 0.005, tool-output loss and edit practice) are off for every row, so a row
#: is the algorithm it names and rows differ only in what their presets say
PROTOCOLS: dict[str, dict[str, Any]] = {
    "book": dict(flags=["--tasks", "book", "--preset-only"], timesteps=12_000, seeds=5,
                 cells=(("train", "train"), ("held-out", "held-out"))),
    "generalisation": dict(flags=["--tasks", "generated", "--foresight", "none", "--call-mask", "call_mask",
                                  "--preset-only"],
                           timesteps=20_000, seeds=3, cells=(("unseen", "unseen test tmpl"), ("pack", "pack"))),
}
#: the generalisation protocol at the recipe's own budget (run for the names the 20,000-step table picks)
PROTOCOLS["generalisation-100k"] = dict(PROTOCOLS["generalisation"], timesteps=100_000)
#: BugFix-v1's repair recipe: a budget in minutes (``--minutes``; None: the recipe's), not env steps
PROTOCOLS["v1"] = dict(flags=["--env", "BugFix-v1", "--rl-only"], timesteps=None, seeds=3,
                       cells=(("test", "test split, one bug"), ("pack", "human-written pack")),
                       algos=("ppo", "grpo", "dr_grpo", "reinforce_pp", "gigpo"))
#: two-sided 95% Student-t quantiles by degrees of freedom (1..10), then the normal's
T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)
TARGET_PASS = 0.8


def algorithm_names() -> tuple[str, ...]:
    """The ``--algo`` names the CLI offers (the algorithm registry's)."""
    from agents.algorithms.presets import ALGORITHMS

    return tuple(ALGORITHMS)


def interval95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% Student-t interval); the half-width is NaN for one value."""
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, float("nan")
    t = T95[len(values) - 2] if len(values) - 1 <= len(T95) else 1.96
    return mean, t * statistics.stdev(values) / math.sqrt(len(values))


def full_batches(curve: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The curve without a last iteration cut short by the step budget (fewer than half the median steps
    of an iteration): the episodes that end within a few steps are the short ones, so its pass rate is biased."""
    if len(curve) < 3:
        return curve
    steps = [b["num_timesteps"] - a["num_timesteps"] for a, b in zip(curve, curve[1:])]
    return curve[:-1] if steps[-1] < 0.5 * statistics.median(steps) else curve


def steps_to(curve: list[dict[str, Any]], target: float = TARGET_PASS) -> int | None:
    """The env steps at the first full iteration whose rollouts passed ``target`` of their episodes, or None."""
    for point in full_batches(curve):
        if point.get("pass_rate") is not None and point["pass_rate"] >= target:
            return int(point["num_timesteps"])
    return None


# ---------------------------------------------------------------------- running
def expected_settings(protocol: str, algo: str, seed: int = 0) -> dict[str, Any]:
    """The settings (``run.json``, as JSON reads back) a run of ``algo`` under ``protocol`` trains with: what
    ``bugfix-gym train`` builds of the protocol's flags."""
    if protocol == "v1":
        from agents.cli.train_v1 import build_parser as build_v1_parser, settings_of

        v1_args = build_v1_parser().parse_args(["--algo", algo, *PROTOCOLS[protocol]["flags"], "--seed", str(seed)])
        return json.loads(json.dumps(settings_of(v1_args)))
    from agents.cli.parser import build_parser
    from agents.cli.settings import train_settings

    args = build_parser().parse_args(["train", "--algo", algo, *PROTOCOLS[protocol]["flags"], "--seed", str(seed)])
    return json.loads(json.dumps(train_settings(args)))


def settings_digest(protocol: str, algo: str) -> str:
    """8 hex digits of the algorithm settings and flags a run of ``algo`` under ``protocol`` has now: a run made
    under other settings (an older preset or protocol) sits in another folder and is not read into the table."""
    text = json.dumps([PROTOCOLS[protocol]["flags"], expected_settings(protocol, algo)["ppo"]], sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:8]


def run_dir(protocol: str, algo: str, seed: int) -> Path:
    return OUT / protocol / algo / settings_digest(protocol, algo) / f"seed-{seed}"


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "agents.cli", *args]


def run_one(protocol: str, algo: str, seed: int, budget: float | None) -> dict[str, Any]:
    """Train one cell's seed (unless its results exist), evaluate what the protocol asks, and return
    its record (also written to ``record.json`` in the run's folder).

    :param budget: env steps (``--timesteps``), or on the v1 protocol minutes (``--minutes``; None: the recipe's)

    :raises RuntimeError: the training or an evaluation exited non-zero (its last output lines)
    """
    out = run_dir(protocol, algo, seed).resolve()
    record_file = out / "record.json"
    if record_file.exists():
        return json.loads(record_file.read_text())
    started = time.perf_counter()
    v1 = protocol == "v1"
    if not (out / "results.json").exists():
        flag = "--minutes" if v1 else "--timesteps"
        _run(_cli("train", "--algo", algo, *PROTOCOLS[protocol]["flags"], *([flag, str(budget)] if budget else []),
                  "--seed", str(seed), "--out", str(out), "--no-progress"), out.with_suffix(".log"))
    results = json.loads((out / "results.json").read_text())
    trained = json.loads((out / "run.json").read_text())["ppo"]
    if trained != expected_settings(protocol, algo, seed)["ppo"]:
        raise RuntimeError(f"{out} trained with other settings than {protocol} gives {algo} now: move it aside")
    wall = time.perf_counter() - started
    if v1:  # the base agent and the kept weights on the same test tasks (agents/bugfix/repair_v1.py)
        cells, base = {"test": results["trained"]["pass_rate"]}, {"test": results["base"]["pass_rate"]}
    else:
        cells = {name: results["after"][name]["pass_rate"] for name in results["after"]}
        base = {name: values["pass_rate"] for name, values in (results.get("before") or {}).items()}
    if protocol != "book":
        pack_args = ["--env", "BugFix-v1", "--pack", str(PACK_V1), "--episodes", "2"] if v1 else \
            ["--pack", str(PACK), "--episodes", "8"]
        pack = _run(_cli("eval", str(out / "tokenppo.zip"), *pack_args, "--json", "--seed", str(seed)),
                    out.with_suffix(".eval.log"))
        cells["pack"] = json.loads(pack.strip().splitlines()[-1])["pass_rate"]
    record = dict(protocol=protocol, algo=algo, seed=seed, timesteps=results.get("env_steps", budget) if v1
                  else budget, cells=cells, base=base,
                  settings_digest=settings_digest(protocol, algo), ppo=trained,
                  wall_s=wall, train_s=results["train_s"], kept_iteration=kept_iteration(results),
                  curve=results.get("curve", []),
                  steps_to_target=steps_to(results.get("curve", [])))
    record_file.write_text(json.dumps(record, indent=1))
    return record


def _run(cmd: list[str], log: Path) -> str:
    """Run ``cmd`` with one torch thread, its output to ``log``; its stdout, or a RuntimeError with the log's tail."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)  # `-m` runs ROOT's code
    log.write_text(proc.stdout + proc.stderr)
    if proc.returncode != 0:
        tail = " | ".join((proc.stdout + proc.stderr).strip().splitlines()[-3:])
        raise RuntimeError(f"{' '.join(cmd[2:])} exited {proc.returncode}: {tail}")
    return proc.stdout


def run_table(jobs: list[tuple[str, str, int, float | None]], workers: int) -> list[dict[str, Any]]:
    """Run the (protocol, algo, seed, budget) jobs, ``workers`` at a time; each finished run printed."""
    records: list[dict[str, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {pool.submit(run_one, *job): job for job in jobs}
        for future in concurrent.futures.as_completed(futures):
            protocol, algo, seed, _ = futures[future]
            try:
                record = future.result()
            except RuntimeError as e:
                print(f"  FAILED {protocol} {algo} seed {seed}: {e}", flush=True)
                continue
            records.append(record)
            cells = "  ".join(f"{k} {v:.3f}" for k, v in record["cells"].items())
            print(f"  {protocol:<14} {algo:<22} seed {seed}: {cells}  ({record['wall_s']:.0f} s)", flush=True)
    return records


def kept_iteration(results: dict[str, Any]) -> int | None:
    """The iteration whose weights validation kept (0: the base agent's), from a run's ``results.json`` (v1 has
    it at the top level, v0 under ``validation``); None for a run without validation."""
    if "kept_iteration" in results:
        return results["kept_iteration"]
    return (results.get("validation") or {}).get("kept_iteration")


# ---------------------------------------------------------------------- the report
def read_records() -> list[dict[str, Any]]:
    """Every finished run's record under ``runs/algorithms/`` made with the settings its protocol and preset
    give now (:func:`settings_digest`; older runs stay on disk, out of the table). A record written before
    records kept ``kept_iteration`` takes it from the ``results.json`` beside it."""
    records = []
    for path in sorted(OUT.glob("*/*/*/seed-*/record.json")):
        record = json.loads(path.read_text())
        if "kept_iteration" not in record and (path.parent / "results.json").exists():
            record["kept_iteration"] = kept_iteration(json.loads((path.parent / "results.json").read_text()))
        records.append(record)
    digests: dict[tuple[str, str], str] = {}
    for r in records:
        if r["protocol"] in PROTOCOLS and (r["protocol"], r["algo"]) not in digests:
            digests[r["protocol"], r["algo"]] = settings_digest(r["protocol"], r["algo"])
    return [r for r in records if r.get("settings_digest") == digests.get((r["protocol"], r["algo"]))]


def table_markdown(records: list[dict[str, Any]], protocol: str) -> str:
    """One protocol's table: a row per algorithm, mean +- 95% interval per cell, wall and training time, steps to
    0.8, and how many seeds' validation kept iteration 0 (the row's run is then the base agent's weights)."""
    mine = [r for r in records if r["protocol"] == protocol]
    if not mine:
        return f"(no finished {protocol} runs)"
    cells = PROTOCOLS[protocol]["cells"]
    head = ["algo", "seeds", *[label for _, label in cells], "wall s / run", "train s / run",
            f"env steps to {TARGET_PASS} train pass", "kept iteration 0"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    base = _base_row(mine, cells)
    if base:
        lines.append(base)
    for algo in sorted({r["algo"] for r in mine}, key=lambda a: _order(a)):
        runs = [r for r in mine if r["algo"] == algo]
        row = [f"`{algo}`", str(len(runs))]
        for key, _ in cells:
            row.append(_mean_ci([r["cells"][key] for r in runs if key in r["cells"]]))
        row.append(f"{statistics.fmean(r['wall_s'] for r in runs):.0f}")
        row.append(f"{statistics.fmean(r['train_s'] for r in runs):.0f}")
        reached = [n for n in (steps_to(r["curve"]) for r in runs) if n is not None]
        row.append(f"{statistics.fmean(reached):,.0f} ({len(reached)}/{len(runs)})" if reached
                   else f"never (0/{len(runs)})")
        kept = [r.get("kept_iteration") for r in runs]
        row.append("-" if None in kept else f"{kept.count(0)}/{len(runs)}")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _base_row(records: list[dict[str, Any]], cells: Sequence[tuple[str, str]]) -> str | None:
    """The base agent's row: its pass rates before training (one per seed; the pack is not evaluated before)."""
    by_seed = {r["seed"]: r["base"] for r in records if r.get("base")}
    if not by_seed:
        return None
    row = ["base agent", str(len(by_seed))]
    for key, _ in cells:
        values = [base[key] for base in by_seed.values() if key in base]
        row.append(_mean_ci(values) if values else "-")
    return "| " + " | ".join(row + ["-"] * 4) + " |"


def _mean_ci(values: list[float]) -> str:
    if not values:
        return "-"
    mean, half = interval95(values)
    return f"{mean:.3f}" if math.isnan(half) else f"{mean:.3f} ± {half:.3f}"


def _order(algo: str) -> tuple[int, str]:
    names = algorithm_names()
    return (names.index(algo), algo) if algo in names else (len(names), algo)


def plot_curves(records: list[dict[str, Any]], path: Path) -> None:
    """The rollouts' pass rate against env steps per algorithm: the mean over seeds, a min-max band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    protocols = [p for p in PROTOCOLS if any(r["protocol"] == p for r in records)]
    fig, axes = plt.subplots(1, max(len(protocols), 1), figsize=(7 * max(len(protocols), 1), 4.6), squeeze=False)
    colours = plt.get_cmap("tab20").colors
    for ax, protocol in zip(axes[0], protocols):
        mine = [r for r in records if r["protocol"] == protocol and r["curve"]]
        for algo in sorted({r["algo"] for r in mine}, key=_order):
            k = _order(algo)[0]  # one colour and style per algorithm in every panel
            curves = [full_batches(r["curve"]) for r in mine if r["algo"] == algo]
            grid = np.linspace(0, min(c[-1]["num_timesteps"] for c in curves), 40)
            ys = np.array([np.interp(grid, [p["num_timesteps"] for p in c], [p["pass_rate"] or 0.0 for p in c])
                           for c in curves])
            colour, style = colours[2 * k if k < 10 else (2 * (k - 10) + 1) % 20], ("-", "--", ":")[k % 3]
            ax.plot(grid, ys.mean(0), style, color=colour, label=f"{algo} ({len(curves)})", lw=1.5)
            ax.fill_between(grid, ys.min(0), ys.max(0), color=colour, alpha=0.07)
        ax.set_title(f"{protocol}: rollouts' train pass rate (mean, min-max over seeds)", fontsize=9)
        ax.set_xlabel("env steps")
        ax.set_ylabel("train pass rate")
        ax.set_ylim(0, 1.02)
        ax.legend(fontsize=7, ncol=3, loc="upper left")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(records: list[dict[str, Any]]) -> str:
    """The table of every protocol as markdown (also written with the PNG under ``runs/algorithms/``)."""
    text = "\n\n".join(f"### {protocol} ({PROTOCOLS[protocol]['seeds']} seeds asked)\n\n"
                       f"{table_markdown(records, protocol)}" for protocol in PROTOCOLS)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "table.md").write_text(text + "\n")
    if records:
        plot_curves(records, OUT / "learning_curves.png")
    return text


def _names(text: str, allowed: Sequence[str], what: str) -> list[str]:
    names = [n for n in text.split(",") if n]
    unknown = [n for n in names if n not in allowed]
    if unknown:
        raise SystemExit(f"algorithms.py: unknown {what} {unknown[0]!r}; choose from {', '.join(allowed)}")
    return names


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", default="book,generalisation",
                   help="comma-separated: book, generalisation, generalisation-100k, v1 (default: the first two)")
    p.add_argument("--algos", default=None,
                   help="comma-separated --algo names (default: all; on v1 ppo,grpo,dr_grpo,reinforce_pp,gigpo)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 per cell (default: 5 book, 3 generalisation)")
    p.add_argument("--timesteps", type=int, default=None,
                   help="env steps per run (default: 12000 book, 20000 generalisation)")
    p.add_argument("--minutes", type=float, default=None,
                   help="v1: training minutes per run (default: the v1 recipe's)")
    p.add_argument("--jobs", type=int, default=2, help="runs at a time (default 2, one per core)")
    p.add_argument("--report", action="store_true", help="only read the finished runs and write the table")
    args = p.parse_args(argv)
    protocols = _names(args.protocol, tuple(PROTOCOLS), "protocol")
    asked = _names(args.algos, algorithm_names(), "algorithm") if args.algos else None

    def algos(protocol: str) -> Sequence[str]:
        return asked or PROTOCOLS[protocol].get("algos") or algorithm_names()

    def budget(protocol: str) -> float | None:
        return args.minutes if protocol == "v1" else args.timesteps or PROTOCOLS[protocol]["timesteps"]

    if not args.report:
        jobs = [(protocol, algo, seed, budget(protocol))
                for protocol in protocols for algo in algos(protocol)
                for seed in range(args.seeds or PROTOCOLS[protocol]["seeds"])]
        started = time.perf_counter()
        run_table(jobs, max(1, args.jobs))
        print(f"{len(jobs)} runs in {time.perf_counter() - started:.0f} s", flush=True)
    records = [r for r in read_records() if r["protocol"] in protocols and r["algo"] in algos(r["protocol"])]
    print(report(records))
    return records


if __name__ == "__main__":
    main()
