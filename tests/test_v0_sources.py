"""v0's task sources as BugFix-v1 problems: the book's tasks and the generator's templates, with their cases
computed in the worker, their splits kept, and v0 itself untouched."""

from __future__ import annotations

import pytest

from bugfix_gym.execution.repair_cases import CallCase
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks import library, v0_sources
from bugfix_gym.tasks.generator import generate_tasks
from bugfix_gym.tasks.problems import normalise_source
from bugfix_gym.tasks.templates import TEMPLATES
from bugfix_gym.tasks.v0_sources import book_problems, template_problems, v0_problem


def test_the_book_s_tasks_are_problems_with_v0_s_cases():
    problems = book_problems()
    assert [len(book_problems(s)) for s in ("train", "heldout")] == [20, 10] and len(problems) == 30
    v0 = {t.name: t for t in library.make_tasks("all")}
    for p in problems:
        task = v0[p.entry]
        assert p.pid == f"book/{task.name}" and p.origin == "book" and p.split == task.split
        assert p.statement == task.statement and p.support == ""
        # the same inputs and expected values as v0 computes, types and all (1 and 1.0 differ)
        assert repr([(c.args, c.expected) for c in p.hidden]) == repr(list(task.hidden))
        assert p.visible == p.hidden[:3]
        assert normalise_source(library.correct_source(task)) == p.source  # the correct function, not the buggy one


def test_the_templates_are_problems_in_v0_s_disjoint_splits():
    problems = template_problems()
    assert [len(template_problems(s)) for s in ("train", "heldout", "test")] == [63, 6, 7]
    for split in ("train", "heldout", "test"):
        keys = [t.key for t in TEMPLATES[split]]
        assert [p.pid for p in template_problems(split)] == [f"template/{k}" for k in keys]
    p = v0_problem("template/count_greater")
    assert p.entry == "count_greater" and p.statement == "count the items of xs that are strictly greater than t"
    assert p.source == ("def count_greater(xs, t):\n    count = 0\n    for x in xs:\n        if x > t:\n"
                        "            count += 1\n    return count\n")
    assert p.hidden[:3] == (CallCase(([2, 2, 3], 2), 1), CallCase(([5, 1, 5, 9], 5), 1), CallCase(([], 1), 0))
    assert all(len({repr(c.args) for c in q.hidden}) == len(q.hidden) >= 3 for q in problems)  # no repeated input
    assert v0_sources._templates() is v0_sources._templates()  # built once, one worker batch


def test_every_v0_problem_passes_its_cases_and_a_broken_copy_does_not():
    for p in (*book_problems(), *template_problems()):
        assert run_repair_tests(p.entry, p.support, p.hidden, p.source).ok, p.pid
    p = v0_problem("book/clamp")
    assert not run_repair_tests(p.entry, "", p.hidden, p.source.replace("max(lo", "min(lo")).ok


def test_building_them_leaves_v0_as_it_was():
    before = [(t.name, t.source, t.hidden) for t in generate_tasks("train", n=10, seed=3)]
    v0_sources._templates.cache_clear()
    v0_sources._book.cache_clear()
    template_problems(), book_problems()
    assert [(t.name, t.source, t.hidden) for t in generate_tasks("train", n=10, seed=3)] == before


def test_unknown_splits_and_pids_say_what_to_do():
    with pytest.raises(ValueError, match="use one of train, heldout or 'all'|use one of train, heldout"):
        book_problems("test")
    with pytest.raises(KeyError, match="'book/<name>'"):
        v0_problem("book/nope")
