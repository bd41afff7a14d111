"""Procedural generator: disjoint template splits, checked tasks, seeded, renamed identifiers."""

from __future__ import annotations

import ast
from collections import Counter

import pytest

from bugfix_gym import BugFixEnv, FIX_OPS, evaluate, generate_tasks, get_task, scripted_policy
from bugfix_gym.execution.runner import run_tests
from bugfix_gym.tasks.generator import GENERATED_SPLITS, TEMPLATES
from bugfix_gym.edits.ops import apply_op
from bugfix_gym.tasks.library import task_problems

GENERATED = {split: generate_tasks(split, 40, seed=0) for split in GENERATED_SPLITS}


def _shape(source: str) -> str:
    """The function with every identifier blanked: templates differ in shape, not just names."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            node.id = "_"
        elif isinstance(node, ast.arg):
            node.arg = "_"
        elif isinstance(node, ast.FunctionDef):
            node.name = "_"
    return ast.dump(tree)


def test_template_sets_are_disjoint_across_splits_and_each_covers_every_defect():
    keys = {split: {t.key for t in TEMPLATES[split]} for split in GENERATED_SPLITS}
    assert not keys["train"] & keys["heldout"] and not keys["train"] & keys["test"]
    assert not keys["heldout"] & keys["test"]
    shapes = {split: {_shape(t.source.format_map(_Blank())) for t in TEMPLATES[split]} for split in GENERATED_SPLITS}
    assert not shapes["train"] & shapes["heldout"] and not shapes["train"] & shapes["test"]
    assert not shapes["heldout"] & shapes["test"]
    for split in GENERATED_SPLITS:
        assert {op for t in TEMPLATES[split] for op in t.ops} == set(FIX_OPS), split


class _Blank(dict):
    def __missing__(self, key: str) -> str:
        return f"v_{key}"


@pytest.mark.parametrize("split", GENERATED_SPLITS)
def test_generated_tasks_are_well_formed_and_balanced(split):
    tasks = GENERATED[split]
    assert len(tasks) == 40 and len({t.name for t in tasks}) == 40
    assert Counter(t.fix_op for t in tasks) == {op: 8 for op in FIX_OPS}
    for task in tasks:
        assert task.split == split and not task.sandbox
        assert task_problems(task) == []
        assert run_tests(task, apply_op(task.source, task.fix_op), "hidden").ok
        assert not run_tests(task, task.source, "hidden").ok
        assert task.source.startswith(f"def {task.name}(")
        assert get_task(task.name) is task  # registered, so the oracle finds it by name


def test_generation_is_seeded():
    again = generate_tasks("train", 40, seed=0)
    assert [(t.name, t.source, t.hidden) for t in again] == [(t.name, t.source, t.hidden) for t in GENERATED["train"]]
    other = generate_tasks("train", 40, seed=1)
    assert {t.name for t in other} != {t.name for t in GENERATED["train"]}
    assert generate_tasks("train", 10, seed=0) == GENERATED["train"][:10]  # a prefix of a longer run


def test_identifiers_are_renamed_so_names_do_not_identify_templates():
    tasks = GENERATED["train"]
    stems = Counter(t.name.rsplit("_", 1)[0] for t in tasks)
    assert len(stems) > 15  # many verb_noun stems
    params = {ast.parse(t.source).body[0].args.args[0].arg for t in tasks}
    assert len(params) > 5  # first parameter names vary
    heldout_names = {t.name for t in GENERATED["heldout"]}
    assert not heldout_names & {t.name for t in tasks}


def test_scripted_oracle_passes_generated_tasks_and_blind_does_not():
    tasks = GENERATED["heldout"] + GENERATED["test"]
    assert evaluate(scripted_policy("oracle"), tasks=tasks, n_per_task=1)["pass_rate"] == 1.0
    blind = evaluate(scripted_policy("blind", seed=0), tasks=tasks, n_per_task=2)["pass_rate"]
    assert 0.05 < blind < 0.5


def test_env_runs_on_generated_tasks():
    env = BugFixEnv(tasks=GENERATED["test"])
    obs, info = env.reset(seed=0)
    assert info["task"] in {t.name for t in GENERATED["test"]} and f"fix the function {info['task']}" in obs


def test_bad_arguments_are_rejected():
    with pytest.raises(ValueError, match="unknown generator split 'all'"):
        generate_tasks("all", 5)
    with pytest.raises(ValueError, match="non-negative"):
        generate_tasks("train", -1)
    assert generate_tasks("train", 0) == []


def test_every_template_and_defect_yields_checked_tasks_whose_visible_tests_show_the_bug():
    import numpy as np

    from bugfix_gym.tasks.generator import make_task

    assert len(TEMPLATES["train"]) >= 50  # many distinct training shapes (Procgen's lesson)
    assert sum(not isinstance(t.statement, str) for t in TEMPLATES["train"]) >= 30  # several phrasings
    for split in GENERATED_SPLITS:
        for template in TEMPLATES[split]:
            for op in template.ops:
                rng = np.random.default_rng(1)
                tasks = [make_task(template, op, rng, split) for _ in range(6)]
                good = [t for t in tasks if not task_problems(t)]
                assert len(good) >= 4, (template.key, op)
                assert all(not run_tests(t, t.source, "visible").ok for t in good), (template.key, op)


def test_phrasings_are_drawn_per_task():
    import numpy as np

    from bugfix_gym.tasks.generator import make_task

    template = next(t for t in TEMPLATES["train"] if not isinstance(t.statement, str))
    rng = np.random.default_rng(0)
    firsts = {make_task(template, template.ops[0], rng, "train").statement.split()[0] for _ in range(30)}
    assert firsts == {p.split()[0] for p in template.statement}


def test_generate_from_a_subset_of_templates():
    tasks = generate_tasks("train", 12, seed=0, templates=["larger_exceeds", "window_max"])
    assert {t.fix_op for t in tasks} == {"swap_minmax", "fix_comparison", "fix_range_end"}
    assert all(task_problems(t) == [] for t in tasks)
    with pytest.raises(ValueError, match="unknown train template"):
        generate_tasks("train", 3, templates=["triangle"])  # a test template is not a train template


def test_with_inert_line_keeps_book_tasks_valid_and_leaves_one_statement_functions_alone():
    import dataclasses

    import numpy as np

    from bugfix_gym import make_tasks
    from bugfix_gym.tasks.generator import with_inert_line

    rng = np.random.default_rng(0)
    changed = 0
    for task in make_tasks("all"):
        noisy = with_inert_line(task, rng)
        changed += noisy is not task
        assert noisy is task or (not task_problems(noisy) and noisy.fix_op == task.fix_op)
        assert all((apply_op(task.source, op) == task.source) == (apply_op(noisy.source, op) == noisy.source)
                   for op in FIX_OPS)
    assert changed >= 10  # most of the book's 30 functions have room for one
    one = dataclasses.replace(make_tasks("train")[0], source="def f(a, b):\n    return min(a, b)\n")
    assert with_inert_line(one, rng) is one
    broken = dataclasses.replace(one, source="def f(:\n")
    assert with_inert_line(broken, rng) is broken


def _statements(source: str) -> set[str]:
    """Every simple statement of a function, unparsed (compound ones by their header only)."""
    out = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.Return)):
            out.add(ast.unparse(node))
    return out


def test_recombined_functions_parse_vary_and_come_from_the_train_templates_only():
    import numpy as np

    from bugfix_gym.tasks.generator import WORDS, recombined_function

    rng = np.random.default_rng(0)
    sources = [recombined_function(rng) for _ in range(300)]
    for source in sources:
        (func,) = ast.parse(source).body
        assert isinstance(func, ast.FunctionDef) and isinstance(func.body[-1], ast.Return)
    assert len(set(sources)) > 250  # recombined, not a handful of templates
    # seeded: the same draws give the same functions
    assert [recombined_function(np.random.default_rng(1)) for _ in range(3)] == \
           [recombined_function(np.random.default_rng(1)) for _ in range(3)]
    # a statement of a recombined function, with its names made generic, is one of some train template's
    # statements (with or without an injected defect), never a statement only unseen templates have
    roles = {w: role for role, pool in WORDS.items() for w in pool}

    def generic(stmt: str) -> str:
        return " ".join(f"{{{roles[w]}}}" if w in roles else w for w in stmt.replace("(", " ( ").replace(")", " ) ")
                        .replace(",", " , ").replace("[", " [ ").replace("]", " ] ").replace(":", " : ").split())

    from bugfix_gym.edits.ops import inject_defect

    def template_statements(split: str) -> set[str]:
        out = set()
        for t in TEMPLATES[split]:
            source = t.source.format(f="f", **{role: pool[0] for role, pool in WORDS.items()})
            for variant in [source] + [inject_defect(source, op) for op in t.ops]:
                out |= {generic(s) for s in _statements(variant)}
        return out

    train = template_statements("train")
    unseen_only = (template_statements("test") | template_statements("heldout")) - train
    drawn = {generic(s) for source in sources for s in _statements(source)}
    assert drawn <= train | {"return 0"}
    assert unseen_only and not drawn & unseen_only


def test_edit_practice_answers_as_the_env_does():
    import numpy as np

    from bugfix_gym.tasks.generator import edit_practice
    from bugfix_gym.edits.ops import describe_change

    rng = np.random.default_rng(3)
    for _ in range(50):
        (read, source), *edits = edit_practice(rng)
        assert read == "read" and len(edits) == 3 and len({call for call, _ in edits}) == 3
        for call, answer in edits:
            new = apply_op(source, call.split()[1])
            assert answer == describe_change(source, new)  # what BugFixEnv's edit tool prints
            source = new
