"""BugFix-v1's BPE tokenizer: trained on the train split's text only, committed as data.

The training text is what an agent reads and writes on the **train** split's functions (never heldout or test):
for one task of each train function (drawn with the function's id as seed, as ``agents.bugfix.v1.split_tasks``
draws), the transcript of the scripted debugger's twelve-turn episode (the reset prompt, each call, each tool
output: ``read``, ``test``, ``locate``, ``changed``, ``revert``, the end of the episode) and every legal call
of the task at reset, each once. :func:`~bugfix_gym.contract.bpe_tokenizer.train_bpe` makes a byte-level BPE of
:data:`VOCAB_SIZE_V1` ids from it, deterministically.

``python -m bugfix_gym.core.bpe_v1 --write`` writes the committed file (:data:`BPE_FILE` under
``bugfix_gym/tasks/data/``); ``--check`` trains again and compares (about two minutes: it plays 100 episodes).
:func:`load_bpe_v1` reads the committed file. docs/tinyagent_v1.md has the lengths it gives.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from functools import lru_cache
from typing import Any, Sequence

from ..contract.bpe_tokenizer import BPETokenizer, train_bpe
from ..contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL

BPE_FILE = "bpe_v1.json"
"""The committed tokenizer, under ``bugfix_gym/tasks/data/``."""
FILE_FORMAT = "bugfix-gym/bpe-v1"
VOCAB_SIZE_V1 = 1024
"""Ids of the committed tokenizer (docs/tinyagent_v1.md says why this size)."""
TRAIN_TURNS = 12


def debugger_transcript(env: Any, task: str, max_turns: int = TRAIN_TURNS) -> list[tuple[int, str]]:
    """The ``(owner, text)`` segments of the scripted debugger's episode on ``task``: the prompt, then each call
    and the tool output that answered it (the last one is the end-of-episode text), as the sampler records them.

    :param env: a :class:`~bugfix_gym.core.env_v1.BugFixEnvV1` holding ``task``
    :param task: the task's name in the env (``problem:name`` always works)
    :param max_turns: the debugger's turn budget (the env's ``max_turns``)
    """
    from .scripted_v1 import make_policy

    policy = make_policy("debugger", max_turns=max_turns)
    observation, info = env.reset(seed=0, options={"task": task})
    policy.reset(0)
    legal = env.unwrapped.legal_calls
    segments = [(OWNER_PROMPT, str(observation))]
    while True:
        call = policy(observation, info, legal)
        observation, _, terminated, truncated, info = env.step(call)
        segments += [(OWNER_POLICY, call), (OWNER_TOOL, str(observation))]
        if terminated or truncated:
            return segments


def one_task_per_problem(tasks: Sequence[Any]) -> list[Any]:
    """One task of each problem, drawn with the problem's id as seed from its tasks by name, in problem order."""
    by_problem: dict[str, list[Any]] = defaultdict(list)
    for task in tasks:
        by_problem[task.problem].append(task)
    return [random.Random(problem).choice(sorted(group, key=lambda t: t.name))
            for problem, group in sorted(by_problem.items())]


def split_transcripts(split: str, max_turns: int = TRAIN_TURNS) -> list[list[tuple[int, str]]]:
    """:func:`debugger_transcript` of one task of each function of a BugFix-v1 split."""
    from .env_v1 import BugFixEnvV1

    env = BugFixEnvV1(split=split, max_turns=max_turns)
    return [debugger_transcript(env, f"{task.problem}:{task.name}", max_turns)
            for task in one_task_per_problem(env.tasks)]


def train_texts() -> list[str]:
    """The training text: the train split's debugger transcripts, segment by segment, then the legal calls of
    each of their tasks at reset, each once. Reads nothing of the heldout or test splits."""
    from .env_v1 import BugFixEnvV1

    env = BugFixEnvV1(split="train", max_turns=TRAIN_TURNS)
    texts: list[str] = []
    for task in one_task_per_problem(env.tasks):
        name = f"{task.problem}:{task.name}"
        texts += [text for _, text in debugger_transcript(env, name)]
        env.reset(seed=0, options={"task": name})
        texts += env.legal_calls()
    return texts


def bpe_file_text(tokenizer: BPETokenizer) -> str:
    """The committed file: a header line of what it is, then the ``tokenizer.json``."""
    head = {"format": FILE_FORMAT, "trained_on": "train split: debugger transcripts and legal calls",
            "vocab_size": tokenizer.vocab_size}
    body = json.dumps(json.loads(tokenizer.to_dict()["tokenizer_json"]), ensure_ascii=False, separators=(",", ":"))
    return json.dumps(head)[:-1] + ',\n "tokenizer": ' + body + "\n}\n"


@lru_cache(maxsize=1)
def load_bpe_v1() -> BPETokenizer:
    """BugFix-v1's BPE tokenizer, from the committed file (:data:`BPE_FILE`)."""
    from importlib import resources

    data = json.loads(resources.files("bugfix_gym.tasks").joinpath("data", BPE_FILE).read_text(encoding="utf-8"))
    if data.get("format") != FILE_FORMAT:
        raise ValueError(f"{BPE_FILE} is not {FILE_FORMAT}: regenerate it with python -m bugfix_gym.core.bpe_v1 "
                         "--write")
    return BPETokenizer(json.dumps(data["tokenizer"]))


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.core.bpe_v1 --check | --write [FILE]``: train BugFix-v1's BPE on the train split
    and compare it with the committed file, or write it."""
    import argparse
    from importlib import resources

    parser = argparse.ArgumentParser(description=main.__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--check", action="store_true", help="train again and compare with the committed file")
    group.add_argument("--write", metavar="FILE", nargs="?", const="",
                       help="train and write FILE (default: the committed file)")
    args = parser.parse_args(argv)
    tokenizer = train_bpe(train_texts(), VOCAB_SIZE_V1)
    text = bpe_file_text(tokenizer)
    committed = resources.files("bugfix_gym.tasks").joinpath("data", BPE_FILE)
    if args.write is not None:
        path = args.write or str(committed)
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        print(f"wrote {path} : {tokenizer.vocab_size} ids, {len(text.encode())} bytes")
        return 0
    same = committed.is_file() and committed.read_text(encoding="utf-8") == text
    print(f"{BPE_FILE} {'matches' if same else 'differs from'} the tokenizer trained on the train split")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
