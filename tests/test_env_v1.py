"""BugFix-v1: the env's API (check_env, seeding, task choice, splits), its tools, invalid calls, the reward's
integrity (only code that passes every hidden case earns 1), tool output caps, locate, legal_calls and the
masks, and v1 task packs."""

from __future__ import annotations

import difflib
import math

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import bugfix_gym
from bugfix_gym.core.calls_v1 import CALL_INDEX, CALL_KINDS, CallError, parse_call_v1
from bugfix_gym.core.env_v1 import MAX_TOOL_CHARS, BugFixEnvV1, apply_call, cap
from bugfix_gym.core.locate import SITES_CHARS, SITES_MARK, line_sites, locate_text, ochiai, ranked
from bugfix_gym.core.scripted_v1 import locate_scores
from bugfix_gym.edits.sites import ARGS, MAX_EXPRS, MAX_LINES, MUTATIONS, legal_edits
from bugfix_gym.execution.repair_runner import run_repair_tests
from bugfix_gym.tasks.humaneval import humaneval_problems

PACK = "examples/task_pack_v1_example.json"


@pytest.fixture(scope="module")
def env() -> BugFixEnvV1:
    return gym.make("BugFix-v1", split="test").unwrapped


def _play(env, calls):
    out = []
    for call in calls:
        out.append(env.step(call))
        if out[-1][2] or out[-1][3]:
            break
    return out


def _task_named(env, prefix):
    return next(name for name in env._names if name.startswith(prefix))


# ---------------------------------------------------------------------- the gymnasium API
def test_check_env_passes():
    check_env(gym.make("BugFix-v1", split="test").unwrapped, skip_render_check=True)


def test_reset_with_a_seed_gives_the_same_task_and_prompt_and_seeds_differ(env):
    first = [env.reset(seed=s)[1]["task"] for s in range(6)]
    again = [env.reset(seed=s)[1]["task"] for s in range(6)]
    assert first == again
    assert len(set(first)) >= 4
    obs, _ = env.reset(seed=3)
    assert obs == env.reset(seed=3)[0] and obs.startswith(f"fix the function {env.task.entry} : ")
    assert "locate" in obs and "patch L CODE" in obs


def test_reset_picks_a_task_by_name_index_or_object(env):
    name = _task_named(env, "how_many_times~")
    _, info = env.reset(options={"task": name})
    assert info["task"] == name and env.task.name == name and env.source == env.task.source
    task = env.tasks[5]
    assert env.reset(options={"task": 5})[1]["task"] == env._names[5]
    assert env.reset(options={"task": task})[1]["task"] == task.name
    with pytest.raises(ValueError, match="is not a task of this env"):
        env.reset(options={"task": "no_such_task~1"})
    with pytest.raises(ValueError, match="unknown reset option"):
        env.reset(options={"tsk": name})


def test_shared_entry_names_get_the_problem_in_front():
    env = BugFixEnvV1(split="train")  # HumanEval/45 and /71 are both triangle_area
    assert len(set(env._names)) == len(env.tasks)
    shared = [n for n in env._names if n.startswith("HumanEval/45:triangle_area~")]
    assert shared and env.reset(options={"task": shared[0]})[1]["task"] == shared[0]
    assert env.task.problem == "HumanEval/45"


def test_the_splits_are_humaneval_s_and_no_test_function_is_in_train():
    splits = {s: BugFixEnvV1(split=s, bugs=(1, 2)) for s in ("train", "heldout", "test")}
    problems = {s: {t.problem for t in e.tasks} for s, e in splits.items()}
    for s in splits:
        assert problems[s] == {p.pid for p in humaneval_problems(s)}
    assert not problems["test"] & problems["train"] and not problems["heldout"] & problems["train"]
    train_functions = {t.fixed_source for t in splits["train"].tasks}
    assert not train_functions & {t.fixed_source for t in splits["test"].tasks}
    assert {len(t.bugs) for t in splits["test"].tasks} == {1, 2}
    assert {len(t.bugs) for t in BugFixEnvV1(split="test", bugs=2).tasks} == {2}


def test_bad_arguments_are_one_clear_error():
    with pytest.raises(ValueError, match="split must be one of"):
        BugFixEnvV1(split="validation")
    with pytest.raises(ValueError, match="bugs must be 1, 2 or"):
        BugFixEnvV1(bugs=3)
    with pytest.raises(TypeError, match="not a RepairTask or Problem"):
        BugFixEnvV1(tasks=["clamp"])
    with pytest.raises(TypeError, match="actions are call strings"):
        env = BugFixEnvV1(split="test")
        env.reset(seed=0)
        env.step(3)


# ---------------------------------------------------------------------- tools
def test_read_numbers_the_lines_and_shows_the_names_table(env):
    env.reset(options={"task": _task_named(env, "how_many_times~56")})
    obs = env.step("read")[0]
    assert obs.startswith("names : n0 = string , n1 = substring")
    assert "  4|         if string[i:i + len(substring)] == i:" in obs
    assert env.step("read 4")[0].splitlines()[1].startswith("  4| ")


def test_test_shows_the_first_failure_and_a_repair_passes_it(env):
    env.reset(options={"task": _task_named(env, "how_many_times~56")})
    obs = env.step("test")[0]
    assert obs.startswith("visible tests : 1 / 3 passed . first failure : how_many_times(")
    assert "expected" in obs and "got" in obs
    obs, _, _, _, info = env.step("edit 4.11 name n1")
    assert obs == "changed :\n  4|         if string[i:i + len(substring)] == substring:" and info["valid"]
    assert env.step("test")[0] == "visible tests : 3 / 3 passed"


def test_ochiai_by_hand():
    # case 0 passes and runs lines 1, 2; cases 1 and 2 fail and run {1, 2, 3} and {1, 3}: 2 failing cases
    scores = ochiai((True, False, False), (frozenset({1, 2}), frozenset({1, 2, 3}), frozenset({1, 3})))
    assert scores[1] == pytest.approx(2 / math.sqrt(2 * (2 + 1)))  # ran in 2 failing, 1 passing
    assert scores[2] == pytest.approx(1 / math.sqrt(2 * (1 + 1)))
    assert scores[3] == pytest.approx(1.0)  # every failing case, no passing one
    assert [line for line, _ in ranked(scores)] == [3, 1, 2]
    assert ochiai((True, True), (frozenset({1}), frozenset({2}))) == {1: 0.0, 2: 0.0}
    assert locate_text((True,), (frozenset({1}),), None).startswith("all 1 visible tests pass")


def test_locate_lists_the_sites_with_a_legal_edit_of_its_lines_within_the_budget():
    source = "def f(a, b):\n    c = [a, 'line 3 0.50']\n    return a * b + len(c)\n"
    listed = [part.split()[0] for part in line_sites(source, 3).split(" , ")]
    assert listed == [f"{line}.{k}" for (line, k) in legal_edits(source) if line == 3] and "3.1" in listed
    per_case, coverage = (False, True), (frozenset({2, 3}), frozenset({2}))
    text = locate_text(per_case, coverage, None, source=source)
    scored, sites = text.split(SITES_MARK)
    assert scored.endswith(": line 3 1.00 , line 2 0.71") and sites.startswith("3.1 a * b + len(c) , ")
    assert sites == line_sites(source, 3) + " ; " + line_sites(source, 2)  # both fit in SITES_CHARS
    assert locate_scores(text) == {3: 1.0, 2: 0.71}  # a site's code is never read as a score
    assert locate_text(per_case, coverage, None) == scored  # no source: no sites
    long = "def f(x):\n" + "".join(f"    x{i} = x + {i} * x - {i}\n" for i in range(20))
    many = locate_text((False,), (frozenset(range(2, 22)),), None, source=long).split(SITES_MARK)[1]
    assert many.startswith(line_sites(long, 2)) and len(many) <= SITES_CHARS + len(" ; ") * 5
    wide = "def f(x):\n    return [" + ", ".join(f"x + {i}" for i in range(40)) + "]\n"
    cut = locate_text((False,), (frozenset({2}),), None, source=wide).split(SITES_MARK)[1]
    assert cut.endswith(" , ...") and line_sites(wide, 2).startswith(cut[:-len(" , ...")])
    assert len(cut) <= SITES_CHARS + len(" , ...")
    assert line_sites("def f(:\n", 1) == ""


@pytest.mark.parametrize("prefix, line", [("how_many_times~56", 4), ("is_palindrome~9", 3)])
def test_locate_ranks_the_mutated_line_first(env, prefix, line):
    env.reset(options={"task": _task_named(env, prefix)})
    assert env.task.bugs[0].site[0] == line
    obs = env.step("locate")[0]
    assert obs.startswith("suspicious lines (Ochiai, ") and obs.split(" : ")[1].startswith(f"line {line} 1.00 ,")


def test_revert_restores_the_task_s_source_and_is_illegal_before_a_change(env):
    env.reset(options={"task": _task_named(env, "is_palindrome~9")})
    assert not env._info()["call_mask"][CALL_INDEX["revert"]] and "revert" not in env.legal_calls()
    assert env.step("revert")[4]["valid"] is False
    env.step("patch 5 return False")
    assert env.source != env.task.source and "revert" in env.legal_calls()
    obs, _, _, _, info = env.step("revert")
    assert info["valid"] and env.source == env.task.source and obs == "reverted to the task's source"


# ---------------------------------------------------------------------- invalid calls
INVALID = [
    ("", "empty turn"), ("bogus 3", "is not a call"), ("read 99", "line 99 is not in the source"),
    ("patch 99 return True", "line 99 is not in the source"), ("delete 99", "line 99 is not in the source"),
    ("delete 1", "does not compile"),  # the def line: its body is left hanging
    ("edit 3.31 op <", "has sites 3.0-3.13, not 3.31"), ("edit 70.1 op <", "past the end of the source"),
    ("edit 3.1 frobnicate", "unknown mutation"), ("edit 3.1 op", "needs an argument"),
    ("edit 3.1 op <<", "does not take"), ("edit 3 op <", "is not L.K"), ("edit 3.1 op < extra", "not an edit call"),
    ("patch 3 if text[i] ==", "does not compile"), ("patch 3", "write patch L CODE"),
    ("insert 2 return (", "does not compile"), ("patch x return 1", "takes a line number"),
    ("x" * 10 ** 6, "more than 256"), ("read\u00a0", "outside printable ASCII"),
    ("patch 5 return '\u00e9'", "outside printable ASCII"), ("test now", "takes no argument"),
    ("submit 1", "takes no argument"), ("revert", "nothing to revert"),
]


@pytest.mark.parametrize("call, why", INVALID, ids=[c[:24] for c, _ in INVALID])
def test_a_malformed_or_illegal_call_is_an_invalid_turn_with_a_one_line_message(env, call, why):
    env.reset(options={"task": _task_named(env, "is_palindrome~9")})
    before = env.source
    obs, reward, terminated, truncated, info = env.step(call)
    assert obs.startswith("invalid call : ") and why in obs and "\n" not in obs and len(obs) <= MAX_TOOL_CHARS
    assert info["valid"] is False and info["n_invalid"] == 1 and reward == 0.0
    assert env.source == before and not terminated and not truncated
    assert env.step("read")[4]["valid"]  # the episode goes on


def test_invalid_cost_and_call_cost_land_on_the_step():
    env = BugFixEnvV1(split="test", call_cost=0.1, invalid_cost=0.5)
    env.reset(seed=0)
    assert env.step("bogus")[1] == pytest.approx(-0.6)
    assert env.step("read")[1] == pytest.approx(-0.1)


def test_parse_call_v1_reads_each_kind():
    texts = ("read", " test ", "locate", "edit 4.1 op <=", "patch 2 x = 1", "insert 3 y = 2", "delete 4", "revert",
             "submit")
    assert [parse_call_v1(c).kind for c in texts] == list(CALL_KINDS)
    call = parse_call_v1("patch 12   return  a  +  b ")
    assert (call.line, call.code) == (12, "return  a  +  b")
    assert parse_call_v1("edit 4.1 op <=").edit.call == "edit 4.1 op <="
    with pytest.raises(CallError):
        parse_call_v1("delete \u0663")  # an Arabic-Indic digit: not an ASCII line number


DEEP = ["patch 2 return " + "[" * 110 + "]" * 110, "patch 2 return " + "-" * 230 + "1",
        "insert 2 " + "(" * 100 + ")" * 100, "patch 2 return " + "not " * 58 + "1", "patch 2 x = " + "a." * 115 + "b",
        "patch 2 return f'{" + "{" * 50,
        "patch 2 return " + "1+" * 115 + "1", "patch 2 return lambda: " * 10 + "1"]


def test_random_text_never_raises_and_an_invalid_turn_changes_nothing():
    import string

    env = BugFixEnvV1(split="test")
    rng = np.random.default_rng(0)
    words = ["read", "test", "edit", "patch", "insert", "delete", "3", "3.1", "op", "swap", "n0", "c1", "<", "(", "[",
             "return", "x", "=", ":", "if", "0", "99999999999999999999", "-1", "1.5", "\t"]
    for seed in range(12):
        env.reset(seed=seed)
        for _ in range(8):
            pick = rng.random()
            action = (" ".join(rng.choice(words, rng.integers(1, 6))) if pick < 0.35 else
                      "".join(rng.choice(list(string.printable), rng.integers(0, 40))) if pick < 0.6 else
                      str(rng.choice(DEEP)) if pick < 0.75 else str(rng.choice(env.legal_calls()[:-1])))
            before = env.source
            obs, _, terminated, truncated, info = env.step(action)
            assert len(obs) <= MAX_TOOL_CHARS and env.observation_space.contains(obs)
            if not info["valid"]:
                assert env.source == before and "\n" not in obs, (action, obs)
            if terminated or truncated:
                break


# ---------------------------------------------------------------------- rewards
def test_the_known_repair_then_submit_earns_1_and_the_buggy_source_0():
    env = BugFixEnvV1(split="test", bugs=(1, 2))
    chosen = [t for t in env.tasks if len(t.bugs) == 2][:2] + env.tasks[:300:60] + \
        [t for t in env.tasks if t.bugs[0].family == "line_drop"][:1]
    assert any(t.bugs[0].repair.startswith("insert") for t in chosen)
    for task in chosen:
        env.reset(options={"task": task})
        steps = _play(env, [bug.repair for bug in task.bugs] + ["submit"])
        assert all(s[4]["valid"] for s in steps), (task.name, [s[0] for s in steps])
        assert steps[-1][1] == 1.0 and steps[-1][4]["hidden_pass"] and steps[-1][2], task.name
        assert env.source == task.fixed_source
        env.reset(options={"task": task})
        obs, reward, terminated, _, info = env.step("submit")
        assert reward == 0.0 and terminated and not info["hidden_pass"] and obs.startswith("hidden tests failed")


BROKEN = {
    "crash": ["patch 5 raise ValueError('no')"],
    "infinite loop": ["patch 5 while True: pass"],
    "import error": ["insert 1 import no_such_module_anywhere"],
    "exit": ["patch 5 return __import__('os')._exit(0)"],
    "always-equal value": ["patch 4 return Yes(0)", "patch 5 return Yes(1)",
                           "insert 1 class Yes(int): __eq__ = lambda self, other: True"],
    "returns nothing": ["patch 5 return", "patch 4 return"],
}


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_code_after_a_patch_is_a_failure_never_no_failing_test(env, name):
    env.reset(options={"task": _task_named(env, "is_palindrome~9")})
    steps = _play(env, BROKEN[name])
    assert all(s[4]["valid"] for s in steps), [s[0] for s in steps]
    test = env.step("test")[0]
    assert test.startswith("visible tests : 0 / 4 passed . first failure : "), test
    assert not env.step("locate")[0].startswith("all ")
    obs, reward, terminated, _, info = env.step("submit")
    assert reward == 0.0 and terminated and not info["hidden_pass"] and obs.startswith("hidden tests failed : ")


def test_budget_truncates_with_no_reward():
    env = BugFixEnvV1(split="test", max_turns=2)
    env.reset(seed=1)
    steps = _play(env, ["read", "read", "read"])
    assert len(steps) == 2 and steps[-1][3] and steps[-1][4]["stop"] == "budget" and steps[-1][1] == 0.0
    with pytest.raises(RuntimeError, match="episode has ended"):
        env.step("read")


# ---------------------------------------------------------------------- caps
def test_tool_outputs_are_capped_at_500_characters_and_say_so(env):
    env.reset(options={"task": _task_named(env, "minPath~85")})
    assert len(env.source) > MAX_TOOL_CHARS
    obs = env.step("read")[0]
    assert len(obs) <= MAX_TOOL_CHARS and "(cut : lines " in obs
    rest = int(obs.rsplit("read ", 1)[1].split()[0])
    assert env.step(f"read {rest}")[0].splitlines()[1].startswith(f"{rest:3d}| ")
    obs = env.step("patch 23 if ans: " + ";".join(["a=0"] * 58))[0]  # normalised: one line a statement
    assert env.source.count("a = 0") == 58
    assert len(obs) == MAX_TOOL_CHARS and obs.endswith(f" characters, {MAX_TOOL_CHARS} shown)") and "(cut : " in obs
    assert cap("y" * 10) == "y" * 10


# ---------------------------------------------------------------------- legal calls and masks
def _check_legal_calls(env, rng=None, sample=40):
    """legal_calls() agrees with call_mask, and its edits and deletes apply (all of them, or a sample with ``rng``)."""
    calls = env.legal_calls()
    info = env._info()
    kinds = {c.split()[0] for c in calls}
    assert {k for k in CALL_KINDS if info["call_mask"][CALL_INDEX[k]]} == kinds | {"patch", "insert"}
    changes = [c for c in calls if c.startswith(("edit", "delete"))]
    for call in changes if rng is None else rng.choice(changes, min(sample, len(changes)), replace=False):
        assert apply_call(env.source, parse_call_v1(str(call))) != env.source, call
    return calls


def test_every_legal_call_is_valid_as_a_step(env):
    env.reset(options={"task": _task_named(env, "is_palindrome~9")})
    calls = _check_legal_calls(env)
    rng = np.random.default_rng(0)
    for call in [c for c in calls if not c.startswith("edit")] + list(rng.choice(calls, 12)):
        env.reset(options={"task": _task_named(env, "is_palindrome~9")})
        env.step("patch 4 return False")  # a changed source: revert is legal, as the list said
        if call in env.legal_calls():
            assert env.step(call)[4]["valid"], call
    for _ in range(4):  # along a random walk of legal calls
        call = str(rng.choice(_check_legal_calls(env, rng)))
        obs, _, terminated, truncated, info = env.step(call)
        assert info["valid"], (call, obs)
        if terminated or truncated:
            break


def test_edit_mask_levels_agree_with_legal_calls(env):
    env.reset(options={"task": _task_named(env, "how_many_times~56")})
    listed = {tuple(c.split()[1:]) for c in env.legal_calls() if c.startswith("edit ")}
    from_masks = set()
    line_mask = env.edit_mask()
    assert line_mask.shape == (MAX_LINES,) and line_mask.dtype == bool
    assert np.array_equal(line_mask, env._info()["line_mask"])
    for line in np.flatnonzero(line_mask) + 1:
        expr_mask = env.edit_mask(int(line))
        assert expr_mask.shape == (MAX_EXPRS,) and expr_mask.any()
        for expr in np.flatnonzero(expr_mask):
            muts = env.edit_mask(int(line), int(expr))
            assert muts.shape == (len(MUTATIONS),) and muts.any()
            for m in np.flatnonzero(muts):
                args = env.edit_mask(int(line), int(expr), MUTATIONS[m])
                site = f"{line}.{expr}"
                from_masks |= {(site, MUTATIONS[m], ARGS[a]) for a in np.flatnonzero(args)} if args.any() \
                    else {(site, MUTATIONS[m])}
    assert from_masks == listed and len(listed) > 50
    with pytest.raises(ValueError, match="choose line before"):
        env.edit_mask(expr=1)
    with pytest.raises(ValueError, match="line must be an int from 1 to 64"):
        env.edit_mask(65)


# ---------------------------------------------------------------------- packs
def _patch_calls(source: str, fixed: str) -> list[str]:
    """Line calls that turn ``source`` into ``fixed`` (bottom up, so line numbers hold)."""
    a, b = source.splitlines(), fixed.splitlines()
    calls = []
    for op, i1, i2, j1, j2 in reversed(difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes()):
        if op == "equal":
            continue
        for k in range(max(i2 - i1, j2 - j1) - 1, -1, -1):
            if k < min(i2 - i1, j2 - j1):
                calls.append(f"patch {i1 + k + 1} {b[j1 + k].strip()}")
            elif k < i2 - i1:
                calls.append(f"delete {i1 + k + 1}")
            else:
                calls.append(f"insert {i2 + 1} {b[j1 + k].strip()}")
    return calls


def test_v1_pack_tasks_play_through_gym_make():
    tasks = bugfix_gym.load_task_pack(PACK)
    env = gym.make("BugFix-v1", tasks=tasks).unwrapped
    assert [t.name for t in env.tasks] == [t.name for t in tasks]
    for task in tasks:
        obs, info = env.reset(options={"task": task.name})
        assert info["task"] == task.name and task.entry in obs
        assert env.step("submit")[1] == 0.0
        if task.fixed_source is None:
            continue
        env.reset(options={"task": task.name})
        steps = _play(env, _patch_calls(task.source, task.fixed_source) + ["submit"])
        assert all(s[4]["valid"] for s in steps) and steps[-1][1] == 1.0, (task.name, [s[0] for s in steps])


@pytest.mark.slow
def test_v1_pack_problems_play_their_injected_mutants():
    problems = bugfix_gym.load_task_pack("examples/task_pack_v1_correct.json")
    env = gym.make("BugFix-v1", tasks=problems).unwrapped
    assert {t.problem for t in env.tasks} == {p.pid for p in problems}
    for task in env.tasks[::7]:
        env.reset(options={"task": task})
        assert _play(env, [task.bugs[0].repair, "submit"])[-1][1] == 1.0


def test_run_repair_tests_agrees_with_submit_on_a_random_legal_walk():
    env = BugFixEnvV1(split="test")
    rng = np.random.default_rng(1)
    for seed in range(3):
        env.reset(seed=seed)
        for _ in range(3):
            env.step(str(rng.choice([c for c in env.legal_calls() if c != "submit"])))
        source, task = env.source, env.task
        reward = env.step("submit")[1]
        assert reward == float(run_repair_tests(task.entry, task.support, task.hidden, source, cache=False).ok)


def test_the_readme_s_v1_transcript_is_what_the_example_plays():
    import importlib.util
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    spec = importlib.util.spec_from_file_location("bugfix_v1_episode", root / "examples" / "bugfix_v1_episode.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    steps, prompt = example.play()
    assert steps[-1][2] == 1.0 and [s[0] for s in steps] == list(example.CALLS)
    transcript = "\n".join([prompt] + [f">>> {call}\n{obs}" for call, obs, _ in steps])
    assert f"```\n{transcript}\n```" in (root / "README.md").read_text()


def test_render_ansi_shows_the_transcript(capsys):
    env = gym.make("BugFix-v1", split="test", render_mode="ansi")
    env.reset(options={"task": "is_palindrome~9"})
    env.step("test")
    text = env.render()
    assert text.startswith("[turn 1/12]\nfix the function is_palindrome : ") and "\n>>> test\nvisible tests : " in text
    human = BugFixEnvV1(split="test", render_mode="human")
    human.reset(options={"task": "is_palindrome~9"})
    assert "fix the function is_palindrome" in capsys.readouterr().out
