"""One BugFix-v1 episode, call by call: read, test, locate, one sited edit, test, submit.

The task is a HumanEval test-split mutant, ``how_many_times~56`` (HumanEval/18, a variable misuse: the slice is
compared with ``i`` where ``substring`` belongs). The calls are written out here as a person would after reading
each answer: ``locate`` puts line 4 first, ``read``'s names table says ``n1`` is ``substring``, so the edit replaces
site 4.11 (the ``i`` after ``==``) by ``n1``. The transcript in README.md's "BugFix-v1" section is this script's
output.

    python examples/bugfix_v1_episode.py
    python examples/bugfix_v1_episode.py --save      # also writes runs/bugfix_v1_episode.json

Writes nothing unless ``--save`` (then only under runs/).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import gymnasium as gym

import bugfix_gym  # noqa: F401 (registers BugFix-v1)

TASK = "how_many_times~56"
CALLS = ("read", "test", "locate", "edit 4.11 name n1", "test", "submit")


def play() -> tuple[list[tuple[str, str, float]], str]:
    """The episode: ``[(call, observation, reward), ...]`` and the prompt."""
    env = gym.make("BugFix-v1", split="test")
    prompt, _ = env.reset(seed=0, options={"task": TASK})
    steps = []
    for call in CALLS:
        obs, reward, terminated, truncated, _ = env.step(call)
        steps.append((call, obs, reward))
        if terminated or truncated:
            break
    env.close()
    return steps, prompt


def main(argv: list[str] | None = None) -> list[tuple[str, str, float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="also write the transcript to runs/bugfix_v1_episode.json")
    args = parser.parse_args(argv)
    steps, prompt = play()
    print(prompt)
    for call, obs, reward in steps:
        print(f"\n>>> {call}\n{obs}")
    print(f"\nreward {steps[-1][2]}")
    if args.save:
        out = Path("runs") / "bugfix_v1_episode.json"
        out.parent.mkdir(exist_ok=True)
        out.write_text(json.dumps({"task": TASK, "prompt": prompt, "steps": steps}, indent=1))
        print(f"wrote {out}")
    return steps


if __name__ == "__main__":
    main()
