"""verifiers' own eval runner (``run_eval``, the function behind ``vf-eval``) plays BugFix through
``bugfix-gym serve MODEL``: the TinyAgent answers OpenAI chat requests with tool calls, the env of
``bugfix_gym.integrations.verifiers.load_environment`` plays them, the reward is the hidden tests.

    python examples/verifiers_serve.py runs/tokenppo-.../tokenppo.zip --n 20 --rollouts 8

Needs .venv-trl (``make trl-venv``: verifiers 0.4). Prints the mean reward, how episodes ended and the calls per
episode, to compare with ``bugfix-gym eval MODEL --split train --episodes 8`` (docs/verifiers.md). verifiers'
traces and the server's log go to a new folder under runs/verifiers_serve/.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _output_dir() -> Path:
    """Where verifiers writes its results: a new folder under runs/verifiers_serve/ (created)."""
    root = Path("runs") / "verifiers_serve"
    root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="eval-", dir=root))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a TinyAgent model file (bugfix-gym train)")
    parser.add_argument("--split", default="train", help="book split (default: train)")
    parser.add_argument("--n", type=int, default=20, help="tasks (default: 20, each train task once)")
    parser.add_argument("--rollouts", type=int, default=8, help="rollouts per task (default: 8)")
    parser.add_argument("--max-concurrent", type=int, default=8,
                        help="episodes in flight at once (vf-eval's --max-concurrent; default: 8): the server answers "
                             "one call at a time")
    args = parser.parse_args()

    import verifiers.v1 as vf
    from verifiers.v1.cli.eval.runner import run_eval
    from verifiers.v1.configs.cli.eval import EvalConfig

    from bugfix_gym.integrations.verifiers import load_environment

    output = _output_dir()
    log = open(output / "serve.log", "w")  # the server's request log and errors
    server = subprocess.Popen([sys.executable, "-m", "agents.cli", "serve", args.model, "--port", "0",
                               "--model-name", "tinyagent"], stdout=subprocess.PIPE, stderr=log, text=True)
    try:
        line = server.stdout.readline() if server.stdout else ""
        found = re.search(r" at (http://\S+/v1) ", line)
        if not found:
            server.wait(timeout=30)
            said = (output / "serve.log").read_text().strip().splitlines()
            print(said[-1] if said else f"bugfix-gym serve did not start (it printed {line.strip()!r})",
                  file=sys.stderr)
            return 2
        env = load_environment(args.split, tasks="book", n=args.n, seed=0)
        config = EvalConfig(env=env.config, model="tinyagent", num_rollouts=args.rollouts, rich=None, push=False,
                            max_concurrent=args.max_concurrent,
                            client=vf.EvalClientConfig(base_url=found.group(1), api_key_var="BUGFIX_NO_KEY"),
                            output_dir=str(output))
        start = time.time()
        episodes = asyncio.run(run_eval(config))
        wall = time.time() - start
    finally:
        server.terminate()
        server.wait(timeout=30)
        log.close()
    failed = [e for e in episodes if not e.ok]
    for episode in failed[:3]:
        errors = [*episode.errors, *(err for t in episode.traces for err in t.errors)]
        print("failed:", "; ".join(f"{err.type} {err.status_code or ''} {err.message[:200]}" for err in errors),
              file=sys.stderr)
    traces = [e.traces[0] for e in episodes if e.traces]
    rewards = [t.rewards["hidden_tests"].score for t in traces]
    stops = collections.Counter(t.info["bugfix_stop"] for t in traces)
    calls = sum(len(t.info["bugfix_calls"]) for t in traces) / max(len(traces), 1)
    print(f"{len(episodes)} episodes ({sum(e.ok for e in episodes)} ok) in {wall:.0f} s: mean reward "
          f"{sum(rewards) / max(len(rewards), 1):.3f}, ended by {dict(stops)}, {calls:.2f} calls per episode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
