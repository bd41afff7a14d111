"""BugFix-v1's mutants: the validity rule (fails a visible and a hidden case; an equivalent mutant and one that
passes every visible case are dropped), determinism per (problem, seed), tasks whose repair calls lead back to the
original, and the committed HumanEval mutants re-validated on a sample."""

from __future__ import annotations

import random

import pytest

from bugfix_gym.edits.inject import apply_repair, candidates
from bugfix_gym.edits.sites import normalise
from bugfix_gym.execution.repair_cases import CallCase
from bugfix_gym.tasks import mutants as mut
from bugfix_gym.tasks.mutants import Mutant, mutant_task, mutants, stored_mutants, stored_tasks, valid
from bugfix_gym.tasks.problems import Problem


def _problem(source: str, entry: str, visible: tuple, more_hidden: tuple, pid: str = "test/hand") -> Problem:
    return Problem(pid=pid, entry=entry, statement="", source=normalise(source), support="", visible=visible,
                   hidden=visible + more_hidden, split="train", origin="book")


ABS = _problem("def absolute(x):\n    if x < 0:\n        return -x\n    return x\n", "absolute",
               (CallCase((3,), 3), CallCase((5,), 5), CallCase((-4,), 4)), (CallCase((0,), 0), CallCase((-2,), 2)))
# visible cases that never take the negative branch
POSITIVE_ONLY = _problem("def absolute(x):\n    if x < 0:\n        return -x\n    return x\n", "absolute",
                         (CallCase((3,), 3), CallCase((5,), 5)), (CallCase((-2,), 2),))
CLAMP = _problem("def clamp(x, lo, hi):\n    if x < lo:\n        return lo\n    if x > hi:\n        return hi\n"
                 "    return x\n", "clamp",
                 (CallCase((5, 0, 3), 3), CallCase((-1, 0, 3), 0), CallCase((2, 0, 3), 2)),
                 (CallCase((3, 0, 3), 3), CallCase((0, 0, 3), 0), CallCase((9, 1, 4), 4), CallCase((-9, -5, 5), -5)))


def test_the_validity_rule():
    equivalent = normalise("def absolute(x):\n    if x <= 0:\n        return -x\n    return x\n")
    hidden_only = normalise("def absolute(x):\n    if x < 0:\n        return x\n    return x\n")
    visible_fail = normalise("def absolute(x):\n    if x > 0:\n        return -x\n    return x\n")
    assert valid(ABS, [equivalent, visible_fail]) == [False, True]          # equivalent on the hidden cases: dropped
    assert valid(POSITIVE_ONLY, [hidden_only, visible_fail]) == [False, True]  # passes every visible case: dropped
    crashing = normalise("def absolute(x):\n    if x < 0:\n        return -y\n    return x\n")
    assert valid(ABS, [crashing]) == [True]                                  # a crash fails its cases


def test_no_mutants_when_the_original_fails_its_hidden_cases():
    wrong = _problem("def absolute(x):\n    return x\n", "absolute", (CallCase((3,), 3),), (CallCase((-2,), 2),))
    assert mutants(wrong) == ()


def test_kept_mutants_fail_visible_and_hidden_and_the_dropped_ones_do_not():
    from bugfix_gym.execution.repair_runner import run_repair_tests

    kept = mutants(CLAMP)
    assert len(kept) > 10
    for m in kept:
        assert not run_repair_tests("clamp", "", CLAMP.visible, m.source).ok
        assert not run_repair_tests("clamp", "", CLAMP.hidden, m.source).ok
    kept_sources = {m.source for m in kept}
    for m in mut._one_bug(CLAMP):
        if m.source not in kept_sources:
            assert run_repair_tests("clamp", "", CLAMP.visible, m.source).ok or \
                run_repair_tests("clamp", "", CLAMP.hidden, m.source).ok


def _check_chain(task_source: str, fixed: str, bugs: tuple) -> None:
    source = task_source
    for bug in bugs:
        assert bug.buggy_source == source
        source = apply_repair(source, bug.repair)
    assert source == fixed


def test_mutants_are_deterministic_per_problem_and_seed_and_their_tasks_repair_back():
    two = mutants(CLAMP, seed=0, bugs=2)
    assert two == mutants(CLAMP, seed=0, bugs=2) and 0 < len(two) <= mut.MAX_TWO_BUG
    assert [m.name for m in two] != [m.name for m in mutants(CLAMP, seed=1, bugs=2)]
    for m in two + mutants(CLAMP):
        task = mutant_task(CLAMP, m)
        assert task.name == m.name and task.name.startswith("clamp~") and task.fixed_source == CLAMP.source
        assert task.source == m.source != CLAMP.source and task.hidden == CLAMP.hidden
        _check_chain(task.source, CLAMP.source, task.bugs)
    for m in two:
        first, second = m.bugs
        assert first.site[0] < second.site[0] and len(m.ids) == 2


def test_records_round_trip():
    for m in mutants(CLAMP) + mutants(CLAMP, bugs=2):
        again = mut._from_record(CLAMP, mut._record(CLAMP, m))
        assert again == m


@pytest.fixture(scope="module")
def humaneval_sample():
    """One problem of each split (quick ones: a mutant that loops forever costs its full loop budget)."""
    from bugfix_gym.tasks.humaneval import humaneval_problem

    return [humaneval_problem(pid) for pid in ("HumanEval/0", "HumanEval/98", "HumanEval/12")]


def test_stored_humaneval_mutants_revalidate_on_a_sample(humaneval_sample):
    rng = random.Random(1)
    for problem in humaneval_sample:
        for bugs, n in ((1, 8), (2, 3)):
            stored = stored_mutants(problem, bugs)
            assert stored
            for m in stored:
                _check_chain(m.source, problem.source, m.bugs)
                found = candidates(problem.source, problem.entry)
                assert sorted(found[i].key for i in m.ids) == sorted(b.key for b in m.bugs)
            sample = rng.sample(stored, min(n, len(stored)))
            assert valid(problem, [m.source for m in sample]) == [True] * len(sample)
        one = {m.source for m in stored_mutants(problem)}
        assert one <= {m.source for m in mut._one_bug(problem)}


@pytest.mark.slow
def test_the_committed_test_split_mutants_check_out(capsys):
    assert mut.main(["--check", "--split", "test", "--quiet"]) == 0
    assert "32 of 32 problems match" in capsys.readouterr().out


def test_stored_tasks_have_unique_names_per_split():
    from bugfix_gym.tasks.humaneval import humaneval_problems

    for split in ("heldout", "test"):
        for bugs in (1, 2):
            tasks = stored_tasks(humaneval_problems(split), bugs)
            assert len(tasks) > 100 and len({t.name for t in tasks}) == len(tasks)
            assert {t.split for t in tasks} == {split} and all(t.fixed_source and t.bugs for t in tasks)


def test_stale_data_is_a_clear_error(humaneval_sample):
    problem = humaneval_sample[0]
    changed = Problem(**{**problem.__dict__, "source": "import os\n" + problem.source})  # every line moves
    with pytest.raises(mut.MutantDataError, match="stale"):
        stored_mutants(changed)
    with pytest.raises(mut.MutantDataError, match="no stored mutants"):
        stored_mutants(CLAMP)


def test_mutant_names():
    m = Mutant("p", "f", "x", (), (12, 3))
    assert m.name == "f~12.3" and Mutant("p", "f", "x", (), (7,)).name == "f~7"
