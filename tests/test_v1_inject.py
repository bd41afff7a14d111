"""BugFix-v1's bug injection: every family round-trips (inject, apply its repair: the original's AST back), the
defect-class table's examples are what the engine produces, the enumeration is deterministic, and a bug whose
repair the action space cannot write is not a candidate."""

from __future__ import annotations

import ast
import random
import warnings

import pytest

from bugfix_gym.edits import inject
from bugfix_gym.edits.defect_classes import DEFECT_CLASSES, FAMILIES
from bugfix_gym.edits.inject import (FAMILY_ORDER, InjectionError, apply_repair, candidates, injection, injections,
                                     second_injection)
from bugfix_gym.edits.sites import Edit, is_legal, normalise

_TOTAL = "def total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n"
_POS = "def pos(xs):\n    out = []\n    for x in xs:\n        if x > 0:\n            out.append(x)\n    return out\n"

FAMILY_SOURCES = {
    "op_assign": _TOTAL,
    "line_drop": "def uniq(xs):\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
                 "            seen.add(x)\n            out.append(x)\n    return out\n",
    "line_dup": _TOTAL,
    "op_arith": "def diff(a, b):\n    return a - b\n",
    "op_compare": "def below(xs, k):\n    return [x for x in xs if x < k]\n",
    "op_bool": "def both(a, b):\n    return a and b\n",
    "var_replace": "def span(lo, hi):\n    return hi - lo\n",
    "operand_swap": "def at(a, i, j):\n    return a[i][j] - a[j:i][0]\n",
    "prepend": "def digits(n):\n    out = ''\n    while n:\n        out = str(n % 10) + out\n        n //= 10\n"
               "    return out\n",
    "plus1_added": "def last(xs, i):\n    return xs[i] if i < len(xs) else None\n",
    "plus1_missing": "def upto(n):\n    return list(range(n + 1))\n",
    "const_change": "def count_pos(xs):\n    count = 0\n    for x in xs:\n        if x > 0:\n            count += 1\n"
                    "    return (count, '', [], None, True)\n",
    "listify_drop": "def empty_sets():\n    return [[]]\n",
    "listify_add": "def none(x):\n    if x:\n        return x\n    return []\n",
    "slice_drop": "def rest(xs):\n    return sum(xs[1:]) + sum(xs[:-1])\n",
    "slice_add": _TOTAL,
    "method_replace": "def shout(s):\n    return s.upper().strip().startswith('A')\n",
    "field_replace": "def pair(node):\n    return (node.value, node.next.value)\n",
    "arith_drop": "def scale(x, k):\n    return x * k - 2\n",
    "call_drop": "def ordered(xs):\n    return [abs(x) for x in sorted(xs)]\n",
    "call_add": "def gap(a, b):\n    return [a - b, a / b]\n",
    "call_replace": "def top(xs):\n    return max(xs) - min(xs) + len(xs)\n",
    "cond_drop": "def keep(xs, seen, on):\n    return [x for x in xs if x not in seen and on]\n",
    "cond_true": "def drain(q):\n    n = 0\n    while q:\n        q.pop()\n        n += 1\n    return n\n",
    "cond_add": _POS,
    "negate_add": _POS,
    "negate_drop": "def odd(n):\n    return not n % 2 == 0\n",
}


def _entry(source: str) -> str:
    return next(n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef))


def _same_ast(a: str, b: str) -> bool:
    return ast.dump(ast.parse(a)) == ast.dump(ast.parse(b))


def _check_round_trip(source: str, inj: inject.Injection) -> None:
    """Independently of the engine's own check: the bug changes the code, compiles, and its repair (a legal call
    of the right kind) gives the original AST back."""
    assert not _same_ast(inj.buggy_source, source)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(inj.buggy_source, "<mutant>", "exec")
    if inj.family == "line_drop":
        assert inj.repair.startswith("insert ")
    elif inj.family == "line_dup":
        assert inj.repair.startswith("delete ")
    else:
        assert is_legal(inj.buggy_source, Edit.from_call(inj.repair))
    assert _same_ast(apply_repair(inj.buggy_source, inj.repair), source)


def test_every_family_has_a_round_trip_example_and_defect_classes():
    assert set(FAMILY_SOURCES) == set(FAMILY_ORDER)
    assert set(FAMILIES) == set(FAMILY_ORDER)


@pytest.mark.parametrize("family", FAMILY_ORDER)
def test_round_trip(family):
    source = normalise(FAMILY_SOURCES[family])
    found = [i for i in injections(source, _entry(source)) if i.family == family]
    assert found, f"no {family} injection in its example"
    for inj in found:
        assert inj.classes == FAMILIES[family]
        _check_round_trip(source, inj)


def test_defect_class_table_examples_are_what_the_engine_injects():
    assert [c.taxonomy for c in DEFECT_CLASSES] == ["QuixBugs"] * 14 + ["HumanEvalFix"] * 6
    assert len({c.name for c in DEFECT_CLASSES}) == 20
    for cls in DEFECT_CLASSES:
        assert set(cls.families) <= set(FAMILY_ORDER)
        source = normalise(cls.correct)
        made = [i for i in injections(source, _entry(source))
                if i.family == cls.families[0] and i.buggy_source == normalise(cls.buggy)]
        assert [i.repair for i in made] == [cls.repair], cls.name
        _check_round_trip(source, made[0])


def test_injections_round_trip_on_humaneval_problems():
    from bugfix_gym.tasks.humaneval import humaneval_problems

    problems = random.Random(3).sample(humaneval_problems("all"), 6)
    total = 0
    for problem in problems:
        for inj in injections(problem.source, problem.entry):
            _check_round_trip(problem.source, inj)
            total += 1
    assert total > 150


def test_injection_only_touches_the_entry_function():
    source = normalise("def helper(a):\n    return a + 1\n\ndef f(x):\n    return helper(x) - 1\n")
    lines = {c.site[0] for c in candidates(source, "f")}
    assert lines == {5}
    for inj in injections(source, "f"):
        assert inj.buggy_source.splitlines()[:3] == source.splitlines()[:3]


def test_enumeration_is_deterministic_and_keys_are_unique():
    source = normalise(FAMILY_SOURCES["const_change"])
    first = [(i.key, i.buggy_source, i.repair) for i in injections(source, "count_pos")]
    inject.candidates.cache_clear()
    inject.injections.cache_clear()
    inject._by_key.cache_clear()
    again = [(i.key, i.buggy_source, i.repair) for i in injections(source, "count_pos")]
    assert first == again and len(first) > 10
    keys = [c.key for c in candidates(source, "count_pos")]
    assert len(keys) == len(set(keys))
    assert injection(source, "count_pos", first[3][0]).buggy_source == first[3][1]


def test_a_bug_whose_repair_cannot_be_written_is_not_a_candidate():
    # node.value -> node.next: 'value' appears nowhere else, so 'attr nK' cannot name it any more
    source = normalise("def pair(node):\n    return (node.value, node.next)\n")
    raw = [c for c in candidates(source, "pair") if c.family == "field_replace"]
    assert raw and not [i for i in injections(source, "pair") if i.family == "field_replace"]
    with pytest.raises(InjectionError, match="no writable repair"):
        injection(source, "pair", raw[0].key)


def test_distinct_buggy_sources_only():
    source = normalise("def f(a, b):\n    return a < b\n")
    found = injections(source, "f")
    assert len({i.buggy_source for i in found}) == len(found)


def test_two_bugs_repair_in_order():
    source = normalise(FAMILY_SOURCES["line_drop"])
    later = next(i for i in injections(source, "uniq") if i.site[0] == 6 and i.family == "line_drop")
    earlier = next(c for c in candidates(source, "uniq") if c.site[0] == 4 and c.family == "slice_add")
    second = second_injection(later, source, "uniq", earlier.key)
    assert second is not None and second.site == earlier.site
    middle = apply_repair(second.buggy_source, second.repair)
    assert middle == later.buggy_source and apply_repair(middle, later.repair) == source
    on_line_7 = next(c.key for c in candidates(source, "uniq") if c.site[0] == 7)
    assert second_injection(later, source, "uniq", on_line_7) is None  # not an earlier line


def test_unknown_entry_or_key_is_a_clear_error():
    with pytest.raises(InjectionError, match="no top-level function 'g'"):
        injections(normalise(_TOTAL), "g")
    with pytest.raises(InjectionError, match="stale"):
        injection(normalise(_TOTAL), "total", "op_arith@9.9:+")
