"""Learning curves of recipe runs: train-batch pass rate and validation (generated heldout) pass / read /
test rates against PPO CPU seconds. Run: .venv/bin/python research/plot_curves.py OUT.png runs/a runs/b ..."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def smooth(xs: list[float], k: int = 10) -> list[float]:
    return [sum(xs[max(0, i - k + 1): i + 1]) / len(xs[max(0, i - k + 1): i + 1]) for i in range(len(xs))]


def main() -> None:
    out, runs = Path(sys.argv[1]), [Path(p) for p in sys.argv[2:]]
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for j, run in enumerate(runs):
        log = json.loads((run / "log.json").read_text())
        res = json.loads((run / "results.json").read_text())
        c = f"C{j}"
        label = f"{run.name} (seed {res['seed']})"
        cpu = [e["cpu_s"] for e in log]
        axes[0].plot(cpu, smooth([e.get("pass_rate", 0) for e in log]), color=c, label=label)
        val = [e for e in log if "val" in e]
        axes[1].plot([e["cpu_s"] for e in val], [e["val"]["pass_rate"] for e in val], color=c, label=label)
        axes[2].plot([e["cpu_s"] for e in val], [e["val"]["read_rate"] for e in val], color=c, ls="-")
        axes[2].plot([e["cpu_s"] for e in val], [e["val"]["test_rate"] for e in val], color=c, ls="--")
        a = res["after"]
        axes[1].scatter([cpu[-1]], [a["gen_test"]["pass_rate"]], color=c, marker="*", s=120, zorder=3)
    axes[0].set_title("train batch pass rate (smoothed)")
    axes[1].set_title("validation: gen heldout pass (line); star: final gen test")
    axes[2].set_title("validation read rate (solid) / test rate (dashed)")
    for ax in axes:
        ax.set_xlabel("PPO CPU seconds")
        ax.set_ylim(0, 1.02)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
