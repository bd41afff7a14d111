"""Does the agent know what an edit will do to code it has just read? A probe of its own predictions.

For each of ``--n`` tasks of each generated split (train, heldout, test templates), the probe
reads the task's source the way an episode does (prompt, ``read``, the source) and asks the
model, for every one of the five ops, what the tool would answer to ``edit <op>``: the
probability it gives to ``no`` (the first word of ``no change``) as the next token. An op is
predicted to change nothing when that probability is above ``--threshold`` (foresight's rule,
``agents.decoding.foresight.Foresight``). The truth is what ``bugfix_gym.apply_op`` does to the source.

Printed per split: accuracy of that prediction over all (task, op) pairs, the mean probability
of ``no`` when the op changes nothing and when it changes a line, and the templates with the
most wrong predictions. The model only predicts: nothing here is played, and the answers (which
op fixes the task) are not used.

Run: ``python examples/edit_answer_probe.py runs/gen/s0/tokenppo.zip`` (``--n``, ``--threshold``).
Prints only; writes nothing.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

import torch

from agents.algorithms.ppo import TokenPPO
from bugfix_gym import FIX_OPS, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, BugFixEnv, apply_op, episode_tokens
from bugfix_gym import generate_tasks

SPLITS = (("train", 5), ("heldout", 77), ("test", 123))  # (split, generator seed)


@torch.no_grad()
def probe(model: TokenPPO, split: str, n: int, gen_seed: int, threshold: float) -> dict:
    """Prediction vs truth for every (task, op) of ``n`` tasks of ``split``."""
    tok, net = model.policy.tokenizer, model.policy.model.eval()
    no = tok.ids["no"]
    rows = []
    for task in generate_tasks(split, n, seed=gen_seed):
        env = BugFixEnv(tasks=[task])
        prompt, _ = env.reset(options={"task": task})
        source, *_ = env.step("read")
        ids, _ = episode_tokens([(OWNER_PROMPT, prompt), (OWNER_POLICY, "read"), (OWNER_TOOL, source)], tok)
        calls = torch.tensor([list(ids) + tok.encode(f"edit {op}") + [tok.eoc_id] for op in FIX_OPS])  # [5, T]
        logits, _ = net(calls)
        p_no = torch.softmax(logits[:, -1].float(), dim=-1)[:, no].tolist()  # [5]
        rows += [(task.template, p, apply_op(source, op) == source) for op, p in zip(FIX_OPS, p_no)]
    right = [(p > threshold) == unchanged for _, p, unchanged in rows]
    wrong = collections.Counter(t for (t, _, _), ok in zip(rows, right) if not ok)
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    return dict(accuracy=mean(right), p_no_if_unchanged=mean([p for _, p, u in rows if u]),
                p_no_if_changed=mean([p for _, p, u in rows if not u]), pairs=len(rows), wrong=wrong.most_common(3))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, help="a model saved by bugfix-gym train")
    parser.add_argument("--n", type=int, default=100, help="tasks per split (default 100)")
    parser.add_argument("--threshold", type=float, default=0.5, help="P(no) above which 'no change' is predicted")
    args = parser.parse_args(argv)
    if args.n < 1 or not 0.0 < args.threshold <= 1.0:
        parser.error("--n must be positive and --threshold in (0, 1]")
    torch.set_num_threads(1)
    try:
        model = TokenPPO.load(args.model)
    except (OSError, ValueError) as e:
        print(f"edit_answer_probe: error: {e}", file=sys.stderr)
        return 2
    print(f"{args.model}: is an edit's answer 'no change'? (P(no) > {args.threshold}; {args.n} tasks x 5 ops)")
    print(f"{'split':<9}{'accuracy':>9}{'P(no) | no change':>19}{'P(no) | changed':>17}   most wrong (template: pairs)")
    for split, gen_seed in SPLITS:
        r = probe(model, split, args.n, gen_seed, args.threshold)
        wrong = ", ".join(f"{t}: {k}" for t, k in r["wrong"]) or "-"
        print(f"{split:<9}{r['accuracy']:>9.3f}{r['p_no_if_unchanged']:>19.2f}{r['p_no_if_changed']:>17.2f}   {wrong}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
