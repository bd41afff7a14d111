"""What the commands print and write: the evaluation table, the learning-curve PNG, strict JSON,
and the task sets of the before/after table."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

EVAL_KEYS = (("pass_rate", "pass rate"), ("valid_calls", "valid calls"), ("submit_rate", "submit rate"),
             ("read_rate", "read rate"), ("test_rate", "test rate"), ("edits_per_episode", "edits / episode"),
             ("first_edit_right", "first edit right"), ("turns", "turns / episode"))
GENERATED_EVAL = dict(n=200, gen_seed=0)  # the unseen-template column of the training table


def table(rows: dict[str, dict[str, float]]) -> str:
    """Columns of evaluation results -> a plain-text table.

    :param rows: column name -> evaluation statistics (a row for each of :data:`EVAL_KEYS` all columns have)
    """
    cols = list(rows)
    width = max(max(len(c) for c in cols) + 2, 10)
    lines = ["".ljust(18) + "".join(c.rjust(width) for c in cols)]
    for key, label in EVAL_KEYS:
        if all(key in rows[c] for c in cols):
            lines.append(label.ljust(18) + "".join(f"{rows[c][key]:.3f}".rjust(width) for c in cols))
    return "\n".join(lines)


def per_task_table(per_task: dict[str, dict[str, float]]) -> str:
    """Each task's pass rate and episodes (``evaluate(..., per_task=True)``) -> a plain-text table.

    :param per_task: task name -> ``{"pass_rate": ..., "episodes": ...}``
    """
    width = max([len(name) for name in per_task] + [4]) + 2
    lines = ["", "task".ljust(width) + "pass rate".rjust(10) + "episodes".rjust(10)]
    lines += [name.ljust(width) + f"{row['pass_rate']:.3f}".rjust(10) + f"{row['episodes']}".rjust(10)
              for name, row in per_task.items()]
    return "\n".join(lines)


def jsonable(obj: Any) -> Any:
    """NaN (a rate over no episodes) -> null, so the output is strict JSON.

    :param obj: numbers, strings, and dicts, lists and tuples of them
    """
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [jsonable(v) for v in obj]
    return obj


def eval_sets(tasks_mode: str, episodes: int) -> dict[str, tuple[list, int]]:
    """The task sets of the before/after table: name -> (tasks, episodes per task).

    :param tasks_mode: the run's ``--tasks`` (``book`` or ``generated``)
    :param episodes: episodes per task on the book's tasks (``--eval-episodes``)
    """
    from bugfix_gym import generate_tasks, make_tasks

    unseen = generate_tasks("test", GENERATED_EVAL["n"], seed=GENERATED_EVAL["gen_seed"])
    if tasks_mode == "book":
        return {"train": (make_tasks("train"), episodes), "held-out": (make_tasks("heldout"), episodes),
                "unseen": (unseen, 1)}
    return {"train tmpl": (generate_tasks("train", GENERATED_EVAL["n"], seed=10_000), 1),
            "book held-out": (make_tasks("heldout"), episodes), "unseen": (unseen, 1)}


def before_after(before: dict[str, dict[str, float]] | None,
                 after: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """The columns of the training table: ``base <set>`` beside ``PPO <set>`` for each task set.

    :param before: the base agent's results per task set (None for a resumed run: not evaluated)
    :param after: the trained model's results per task set
    """
    columns = {}
    for name in after:
        if before is not None:
            columns[f"base {name}"] = before[name]
        columns[f"PPO {name}"] = after[name]
    return columns


#: the rollout rates the learning curve draws: key, label, line style, marker (distinct, so lines at 1.0 stay visible)
CURVE_LINES = (("pass_rate", "pass rate (rollouts)", "-", "o"), ("valid_calls", "valid calls", "--", "s"),
               ("read_rate", "read rate", ":", "^"), ("test_rate", "test rate", "-.", "v"))
#: a run folder's curve of the iterations before a ``--resume`` (the model file keeps no diagnostics)
EARLIER_CURVE_FILE = "curve_before_resume.json"


def save_earlier_curve(out: Path, diagnostics: list[dict[str, Any]], upto: int) -> None:
    """Keep the curve so far (:data:`EARLIER_CURVE_FILE`, extended) up to iteration ``upto``, for a resumed run.

    :param out: the run folder
    :param diagnostics: the model's per-iteration diagnostics since it was built or loaded
    :param upto: the last iteration the run's snapshot holds
    """
    rows = load_earlier_curve(out) + [{"iteration": d["iteration"], "num_timesteps": d.get("num_timesteps"),
                                       "rollout": d["rollout"]}
                                      for d in diagnostics if "rollout" in d and d["iteration"] <= upto]
    from agents.files.checkpoint import atomic_write

    data = json.dumps({"iterations": jsonable(rows)}).encode()
    atomic_write(out / EARLIER_CURVE_FILE, lambda f: f.write(data))  # a new file renamed in: never a planted link


def load_earlier_curve(out: Path) -> list[dict[str, Any]]:
    """The curve :func:`save_earlier_curve` kept in ``out`` (empty if none)."""
    from agents.files.runs import read_run_file

    path = out / EARLIER_CURVE_FILE
    if not path.exists():
        return []
    try:  # a run folder is data: a damaged curve costs the plot its early part, not the run
        rows = read_run_file(path).get("iterations")
    except (OSError, ValueError):
        return []
    ok = isinstance(rows, list) and all(isinstance(r, dict) and isinstance(r.get("iteration"), int)
                                        and isinstance(r.get("rollout"), dict) for r in rows)
    return list(rows) if ok and isinstance(rows, list) else []


def plot_learning_curve(diagnostics: list[dict[str, Any]], path: Path, title: str,
                        validation: list[tuple[int, float]] | None = None, base_pass_rate: float | None = None,
                        kept: int | list[int] | None = None) -> None:
    """The rollout rates per PPO iteration (and the validation pass rates) as a PNG.

    :param diagnostics: the model's per-iteration diagnostics (``model.diagnostics``; after a resume, the
        earlier iterations' first: :func:`load_earlier_curve`)
    :param path: the PNG to write
    :param title: the plot's title
    :param validation: (iteration, pass rate) of each validation evaluation, if any
    :param base_pass_rate: the base agent's pass rate on the training tasks: a reference line
    :param kept: the iteration whose weights were kept (or the iterations averaged): marked
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = [d for d in diagnostics if "rollout" in d]
    it = [d["iteration"] for d in rows]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    every = max(1, len(it) // 15)
    for k, (key, label, style, marker) in enumerate(CURVE_LINES):  # markers offset: equal lines stay told apart
        ax.plot(it, [d["rollout"].get(key, float("nan")) for d in rows], linestyle=style, marker=marker,
                markersize=3, markevery=(k % every, every), label=label, alpha=0.85)
    if validation:
        ax.plot(*zip(*validation), "kD", markersize=4, linestyle="none", label="validation pass rate")
    if base_pass_rate is not None:
        ax.axhline(base_pass_rate, color="grey", linewidth=1, linestyle=(0, (4, 2)),
                   label=f"base agent pass rate ({base_pass_rate:.2f})")
    for i, iteration in enumerate([kept] if isinstance(kept, int) else list(kept or [])):
        ax.axvline(iteration, color="tab:red", linewidth=0.8, alpha=0.6, label="kept weights" if i == 0 else None)
    ax.set_xlabel("PPO iteration")
    ax.set_ylabel("share of episodes / calls")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(-0.02, 1.1)
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), fontsize=7, ncol=3, frameon=False)  # hides no line
    fig.tight_layout()
    from agents.files.checkpoint import atomic_write

    atomic_write(Path(path), lambda f: fig.savefig(f, dpi=110, format="png"))  # never written through a link
    plt.close(fig)
