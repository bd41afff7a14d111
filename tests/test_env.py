"""BugFixEnv: gymnasium conventions, registration, vector envs, rewards, info, bounded execution."""

from __future__ import annotations

import json
import string
import subprocess
import sys
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import bugfix_gym
from bugfix_gym import CALLS, BugFixEnv, get_task, make_tasks, scripted_policy
from bugfix_gym.execution.cases import MAX_LOOP_TICKS, call_one, compile_function, run_cases
from bugfix_gym.execution.runner import run_tests
from bugfix_gym.tasks.library import Task, task_from_correct, task_problems
from bugfix_gym.views.text_wrappers import HideOutputs, InertLines, StatementDropout

INFO_KEYS = {"task", "turn", "n_turns", "actions", "ops", "n_invalid", "valid", "submitted", "hidden_pass", "stop",
             "call_mask", "useful_calls"}


def test_raw_env_passes_gymnasium_check_env():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make("BugFix-v0").unwrapped, skip_render_check=False)  # with a spec: render modes checked too
    assert [str(w.message) for w in caught] == []


def test_make_after_import_and_spaces_use_printable_charset():
    env = gym.make("BugFix-v0")
    assert isinstance(env.unwrapped, BugFixEnv)
    assert env.spec.id == "BugFix-v0"
    assert env.action_space.contains("edit fix_init")  # '_' and ' ' are outside the default alphanumeric charset
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    env.close()


def test_make_with_module_prefix_works_in_a_fresh_interpreter_without_import():
    code = ("import sys, gymnasium as gym\n"
            "assert 'bugfix_gym' not in sys.modules\n"
            "env = gym.make('bugfix_gym:BugFix-v0')\n"
            "obs, info = env.reset(seed=0)\n"
            "obs, r, term, trunc, info = env.step('read')\n"
            "print(type(env.unwrapped).__name__, info['turn'], obs.startswith('def '))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["BugFixEnv", "1", "True"]


def _vector_rollout(mode: str, **vector_kwargs) -> list:
    envs = gym.make_vec("BugFix-v0", 4, vectorization_mode=mode, vector_kwargs=vector_kwargs)
    try:
        seen = []
        obs, info = envs.reset(seed=[10, 11, 12, 13])
        seen.append((list(obs), list(info["task"])))
        for actions in (["read", "test", "read", "edit fix_init"], ["edit swap_minmax", "read", "garbage", "read"]):
            obs, reward, term, trunc, info = envs.step(actions)
            seen.append((list(obs), list(info["task"]), reward.tolist(), info["turn"].tolist()))
        return seen
    finally:
        envs.close()


def _single_rollout() -> list:
    seen = [[], [], []]
    for i, seed in enumerate([10, 11, 12, 13]):
        env = BugFixEnv()
        obs, info = env.reset(seed=seed)
        seen[0].append(obs)
        for t, actions in enumerate((["read", "test", "read", "edit fix_init"],
                                     ["edit swap_minmax", "read", "garbage", "read"])):
            seen[t + 1].append(env.step(actions[i])[0])
    return seen


def test_make_vec_sync_and_async_return_the_same_fresh_text_observations():
    sync = _vector_rollout("sync")
    async_ = _vector_rollout("async", shared_memory=False)  # shared memory returns stale Text
    assert sync == async_
    singles = _single_rollout()
    for step, expected in enumerate(singles):
        assert sync[step][0] == expected  # each sub-env got its own seed and action
    assert len(set(sync[1][0])) > 1  # not one repeated (stale) observation
    assert all(o.startswith("def ") for o, a in zip(sync[1][0], ["read", "test", "read", "edit"]) if a == "read")


def test_reset_picks_tasks_by_name_index_and_task():
    env = BugFixEnv(split="heldout")
    assert env.reset(options={"task": "clamp"})[1]["task"] == "clamp"  # any registered name
    assert env.reset(options={"task": 2})[1]["task"] == env.tasks[2].name
    task = make_tasks("train")[5]
    obs, info = env.reset(options={"task": task})
    assert info["task"] == task.name and task.statement in obs
    with pytest.raises(KeyError, match="no task named"):
        env.reset(options={"task": "no_such_task"})


def test_reset_draws_from_the_split_with_np_random():
    env = BugFixEnv(split="heldout")
    names = {env.reset(seed=s)[1]["task"] for s in range(60)}
    assert names <= {t.name for t in make_tasks("heldout")}
    assert len(names) >= 8  # uniform over 10 tasks


def test_reward_only_on_submit_and_only_when_hidden_tests_pass():
    env = BugFixEnv()
    task = get_task("clamp")
    env.reset(options={"task": task})
    rewards = [env.step(a)[1] for a in ("read", "test", f"edit {task.fix_op}")]
    obs, reward, terminated, truncated, info = env.step("submit")
    assert rewards == [0.0, 0.0, 0.0] and reward == 1.0
    assert (terminated, truncated, info["stop"], info["submitted"], info["hidden_pass"]) == (True, False, "submit",
                                                                                             True, True)
    env.reset(options={"task": task})
    obs, reward, terminated, truncated, info = env.step("submit")
    assert reward == 0.0 and terminated and not info["hidden_pass"]
    assert obs.startswith("hidden tests failed")


def test_budget_truncates_with_zero_reward():
    env = BugFixEnv(max_turns=6)
    env.reset(seed=0)
    for turn in range(1, 7):
        obs, reward, terminated, truncated, info = env.step("read")
        assert info["turn"] == turn and reward == 0.0 and not terminated
        assert truncated is (turn == 6)
    assert info["stop"] == "budget" and not info["submitted"]
    with pytest.raises(RuntimeError, match="reset"):
        env.step("read")


def test_call_cost_and_edit_penalty_are_off_by_default_and_sit_on_acting_steps():
    task = get_task("clamp")
    plain = BugFixEnv()
    plain.reset(options={"task": task})
    assert [plain.step(a)[1] for a in ("read", "edit swap_minmax", "submit")] == [0.0, 0.0, 1.0]
    costly = BugFixEnv(call_cost=0.1, edit_penalty=0.25)
    costly.reset(options={"task": task})
    got = [costly.step(a)[1] for a in ("read", "edit swap_minmax", "submit")]
    assert got == pytest.approx([-0.1, -0.35, 0.9])


@pytest.mark.parametrize("action", [3, 1.5, None, b"read", ["read"], np.array(["read"])])
def test_non_string_action_raises_type_error(action):
    env = BugFixEnv()
    env.reset(seed=0)
    with pytest.raises(TypeError, match="DiscreteCalls"):
        env.step(action)


def test_invalid_calls_cost_a_turn_and_say_why():
    env = BugFixEnv()
    env.reset(seed=0)
    cases = {"": "empty turn", "edit fix_everything": "unknown edit op", "dance": "is not a call",
             "revert": "nothing to revert"}
    for k, (action, why) in enumerate(cases.items(), start=1):
        obs, reward, terminated, truncated, info = env.step(action)
        assert why in obs and not info["valid"]
        assert info["n_invalid"] == k and info["turn"] == k and reward == 0.0


def test_revert_is_legal_only_after_a_change_and_restores_the_source():
    env = BugFixEnv()
    task = get_task("clamp")
    _, info = env.reset(options={"task": task})
    assert not info["call_mask"][CALLS.index("revert")] and info["call_mask"].sum() == 8
    _, _, _, _, info = env.step("edit swap_minmax")
    assert info["call_mask"].all() and env.unwrapped.source != task.source
    obs, _, _, _, info = env.step("revert")
    assert obs == "reverted to the original source" and info["valid"] and env.source == task.source
    assert not info["call_mask"][CALLS.index("revert")]


def test_useful_calls_close_an_edit_only_after_the_episode_showed_it_useless():
    env = BugFixEnv()
    task = get_task("count_above")  # its answer is fix_comparison; it has no range() for fix_range_end
    _, info = env.reset(options={"task": task})
    assert np.array_equal(info["useful_calls"], info["call_mask"])  # nothing tried yet: nothing closed
    _, _, _, _, info = env.step("edit fix_range_end")
    assert env.source == task.source and not info["useful_calls"][CALLS.index("edit fix_range_end")]
    assert info["useful_calls"].sum() == 7 and info["call_mask"].sum() == 8  # advice only: the call stays legal
    _, _, _, _, info = env.step("edit fix_range_end")
    assert info["valid"] and info["n_invalid"] == 0
    wrong = "fix_init"  # changes the source, and the visible tests then fail
    env.step(f"edit {wrong}")  # a change: on the new source nothing has been tried
    assert env.useful_calls().sum() == 9
    obs, _, _, _, _ = env.step("test")
    assert "first failure" in obs and not env.useful_calls()[CALLS.index("submit")]  # it cannot pass
    env.step("revert")  # back on the original source: the tried wrong edit made a source that failed a test
    useful = env.useful_calls()
    assert not useful[CALLS.index(f"edit {wrong}")] and not useful[CALLS.index("edit fix_range_end")]
    assert useful[CALLS.index("edit fix_comparison")] and useful.sum() == 6
    hidden = HideOutputs(BugFixEnv(), ["test"])  # a hidden test report shows nothing: nothing is closed by it
    hidden.reset(options={"task": task})
    for call in (f"edit {wrong}", "test", "revert"):
        hidden.step(call)
    assert hidden.unwrapped.useful_calls()[CALLS.index(f"edit {wrong}")]


def test_get_state_and_set_state_carry_what_the_episode_has_shown():
    env = BugFixEnv()
    env.reset(options={"task": "count_above"})
    for call in ("edit fix_range_end", "edit fix_init", "test", "revert"):
        env.step(call)
    copy = BugFixEnv()
    copy.set_state(json.loads(json.dumps(env.get_state())))  # plain data, as a resumed run reads it
    assert copy.useful_calls().tolist() == env.useful_calls().tolist() != copy.call_mask().tolist()
    for call in ("edit fix_comparison", "test"):
        mine, theirs = env.step(call), copy.step(call)
        assert mine[:4] == theirs[:4] and mine[4]["useful_calls"].tolist() == theirs[4]["useful_calls"].tolist()


def test_tools_report_source_tests_and_changes():
    env = BugFixEnv()
    task = get_task("clamp")
    env.reset(options={"task": task})
    assert env.step("read")[0] == task.source
    obs = env.step("test")[0]
    assert obs.startswith("visible tests : ") and f"/ {len(task.visible)} passed" in obs
    assert env.step("edit swap_minmax")[0].startswith("changed line 2 : return max(lo, min(x, hi))")
    assert env.step("edit add_zero_guard")[0] == "no change"
    assert env.step("test")[0] == f"visible tests : {len(task.visible)} / {len(task.visible)} passed"


def test_info_is_a_fresh_dict_with_the_spec_keys_every_step():
    env = BugFixEnv()
    _, info0 = env.reset(seed=1)
    assert set(info0) == INFO_KEYS
    info0["actions"].append("tampered")
    info0["call_mask"][:] = False
    _, _, _, _, info1 = env.step("read")
    assert info1["actions"] == ["read"] and info1["call_mask"].sum() == 8
    assert isinstance(info1["valid"], bool) and isinstance(info1["submitted"], bool)


def test_render_ansi_shows_the_transcript_and_an_unsupported_render_mode_falls_back_to_none():
    env = BugFixEnv(render_mode="ansi")
    env.reset(options={"task": "clamp"})
    env.step("read")
    text = env.render()
    assert "[turn 1/6]" in text and ">>> read" in text and "def clamp" in text
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # SB3's make_vec_env default falls back silently
        assert BugFixEnv(render_mode="rgb_array").render_mode is None
    with pytest.warns(UserWarning, match="render_mode='rgb' falls back to None"):
        assert BugFixEnv(render_mode="rgb").render_mode is None
    with pytest.raises(ValueError, match="max_turns"):
        BugFixEnv(max_turns=0)


def test_an_infinite_loop_fails_with_timeout_instead_of_hanging():
    report = run_cases("def spin(n):\n    while True:\n        n += 1\n", "spin", [((1,), 2), ((2,), 3)])
    assert report.passed == 0 and report.total == 2 and "raised Timeout" in report.first_failure
    # the bound is a count, not seconds: each case gets exactly MAX_LOOP_TICKS loop iterations
    func, reset = compile_function("seen = []\ndef spin(n):\n    while True:\n        seen.append(n)\n", "spin")
    assert [call_one(func, reset, (n,)) for n in (1, 2)] == [("raised", "Timeout")] * 2
    seen = func.__globals__["seen"]
    assert seen == [1] * MAX_LOOP_TICKS + [2] * MAX_LOOP_TICKS


def test_compiled_code_is_shared_but_every_function_has_its_own_state():
    source = "seen = []\ndef spin(n):\n    while True:\n        seen.append(n)\n"
    (f, reset_f), (g, reset_g) = compile_function(source, "spin"), compile_function(source, "spin")
    assert f.__code__ is g.__code__  # compiled once
    assert call_one(f, reset_f, (1,)) == ("raised", "Timeout")
    assert g.__globals__["seen"] == [] and call_one(g, reset_g, (2,)) == ("raised", "Timeout")  # own globals, own ticks
    assert f.__globals__["seen"] == [1] * MAX_LOOP_TICKS and g.__globals__["seen"] == [2] * MAX_LOOP_TICKS
    for _ in range(2):  # a source that does not compile raises every time (errors are not cached)
        with pytest.raises(SyntaxError):
            compile_function("def broken(:\n", "broken")


def test_an_edit_that_makes_a_while_loop_spin_does_not_hang_the_env():
    # The correct function counts binary digits; its injected defect (``n > 0`` -> ``n >= 0``)
    # makes the loop spin forever once n reaches 0. fix_comparison toggles it back.
    task = task_from_correct("bit_length_of", "return the number of binary digits of n", """
        def bit_length_of(n):
            count = 0
            while n > 0:
                n = n // 2
                count += 1
            return count
        """, "fix_comparison", [(5,), (1,), (0,), (8,), (255,)], split="custom")
    assert "while n >= 0" in task.source
    env = BugFixEnv(tasks=[task])
    env.reset(seed=0)
    assert "raised Timeout" in env.step("test")[0]
    env.step("edit fix_comparison")
    assert env.step("test")[0] == f"visible tests : {len(task.visible)} / {len(task.visible)} passed"
    env.step("edit fix_comparison")  # spins again
    obs, reward, *_ = env.step("submit")
    assert reward == 0.0 and obs.startswith("hidden tests failed : 0 /")
    # the submit failed because the loop budget (a count of iterations) stopped the spinning case
    assert "raised Timeout" in run_tests(task, env.unwrapped.source, "hidden").first_failure


def test_package_exports_match_the_contract():
    for name in ("BugFixEnv", "make_tasks", "get_task", "build_tokenizer", "encode_segment", "episode_tokens",
                 "scripted_policy", "evaluate", "episode_stats", "parse_call", "CALLS", "FIX_OPS", "OWNER_PAD",
                 "OWNER_PROMPT", "OWNER_POLICY", "OWNER_TOOL", "generate_tasks", "load_task_pack"):
        assert hasattr(bugfix_gym, name), name
    assert len(CALLS) == 9 and len(set(CALLS)) == 9
    owners = (bugfix_gym.OWNER_PAD, bugfix_gym.OWNER_PROMPT, bugfix_gym.OWNER_POLICY, bugfix_gym.OWNER_TOOL)
    assert owners == (0, 1, 2, 3)


def test_throughput_benchmark_runs_and_reports_a_ratio(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "env_throughput.py"
    spec = importlib.util.spec_from_file_location("env_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--steps", "300", "--repeats", "1"])  # which is faster is the benchmark's to report
    assert result["ratio"] == pytest.approx(result["BugFix-v0 (cached)"] / result["CartPole-v1 (random)"])
    assert result["ratio"] > 0 and result["BugFix-v0 (uncached)"] > 0
    assert "BugFix-v0 / CartPole-v1 ratio of medians" in capsys.readouterr().out


# ---------------------------------------------------------------- bad arguments: one clear line each
def _one_line(exc_info) -> str:
    text = str(exc_info.value)
    assert "\n" not in text and len(text) < 300
    return text


def test_render_before_reset_says_to_call_reset():
    env = BugFixEnv(render_mode="ansi")
    with pytest.raises(RuntimeError, match=r"call reset\(\) before render\(\)") as exc_info:
        env.render()
    _one_line(exc_info)
    with pytest.raises(RuntimeError, match=r"call reset\(\) before step\(\)"):
        env.step("read")


@pytest.mark.parametrize("options, error, message", [
    ({"task": 999}, ValueError, "out of range: this env has 20 tasks, use an index from 0 to 19"),
    ({"task": 20}, ValueError, "out of range"),
    ({"task": -1}, ValueError, "out of range"),
    ({"task": np.int64(-3)}, ValueError, "out of range"),
    ({"task": True}, TypeError, "must be a task name, an index into env.tasks or a Task, got bool"),
    ({"task": ["clamp"]}, TypeError, "must be a task name, an index into env.tasks or a Task, got list"),
    ({"task": {"name": "clamp"}}, TypeError, "got dict"),
    ({"task": 1.0}, TypeError, "got float"),
    (["task", "clamp"], TypeError, r"reset options must be a dict such as \{'task': 'clamp'\} or None, got list"),
    ("clamp", TypeError, "reset options must be a dict"),
    ({"tsk": "clamp"}, ValueError, "unknown reset option 'tsk'; the only option is 'task'"),
])
def test_bad_reset_options_give_one_clear_line(options, error, message):
    env = BugFixEnv()
    with pytest.raises(error, match=message) as exc_info:
        env.reset(options=options)
    _one_line(exc_info)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(call_cost=float("nan")), ValueError, "call_cost must be a finite number >= 0"),
    (dict(call_cost=float("inf")), ValueError, "call_cost must be a finite number >= 0"),
    (dict(call_cost=-0.1), ValueError, "call_cost must be a finite number >= 0"),
    (dict(call_cost="0.1"), TypeError, "call_cost must be a finite number >= 0, got str"),
    (dict(edit_penalty=float("nan")), ValueError, "edit_penalty must be a finite number >= 0"),
    (dict(edit_penalty=float("-inf")), ValueError, "edit_penalty must be a finite number >= 0"),
    (dict(invalid_cost=float("inf")), ValueError, "invalid_cost must be a finite number >= 0"),
    (dict(invalid_cost=np.float64("nan")), ValueError, "invalid_cost must be a finite number >= 0"),
    (dict(invalid_cost=-1), ValueError, "invalid_cost must be a finite number >= 0"),
    (dict(no_change_cost=float("nan")), ValueError, "no_change_cost must be a finite number >= 0"),
    (dict(max_turns="6"), TypeError, "max_turns must be an int >= 1, got str"),
    (dict(max_turns=2.5), TypeError, "max_turns must be an int >= 1, got float"),
    (dict(max_turns=True), TypeError, "max_turns must be an int >= 1, got bool"),
    (dict(max_turns=None), TypeError, "max_turns must be an int >= 1, got NoneType"),
    (dict(max_turns=-2), ValueError, "max_turns must be at least 1"),
    (dict(generated="all"), ValueError, "generated must be one of 'train', 'heldout', 'test' or None"),
    (dict(generated=["train"]), ValueError, "generated must be one of"),
    (dict(generated="train", tasks=make_tasks("train")), ValueError, "either tasks= .* or generated="),
    (dict(generated="train", ambiguous_share=1.5), ValueError, r"ambiguous_share is a share of episodes in \[0, 1\]"),
    (dict(generated="test", ambiguous_share=0.3), ValueError, "ambiguous_share needs generated='train'"),
    (dict(ambiguous_share=0.3), ValueError, "ambiguous_share needs generated='train'"),
    (dict(statement_dropout=0.3), TypeError, r"statement_dropout is a wrapper, not a BugFixEnv argument: use "
                                             r"gym.make\('BugFix-v0', statement_dropout=...\) or wrap the env in "
                                             r"bugfix_gym.views.text_wrappers.StatementDropout"),
    (dict(hide_outputs=["read"]), TypeError, "hide_outputs is a wrapper, not a BugFixEnv argument"),
    (dict(max_turn=6), TypeError, r"BugFixEnv.__init__\(\) got an unexpected keyword argument 'max_turn'"),
])
def test_bad_constructor_arguments_give_one_clear_line(kwargs, error, message):
    with pytest.raises(error, match=message) as exc_info:
        BugFixEnv(**kwargs)
    _one_line(exc_info)


def test_numpy_numbers_are_accepted_where_python_numbers_are():
    env = BugFixEnv(max_turns=np.int64(3), call_cost=np.float32(0.5), invalid_cost=1)
    assert (env.max_turns, env.call_cost, env.invalid_cost) == (3, 0.5, 1.0)
    assert type(env.max_turns) is int and type(env.call_cost) is float
    assert env.reset(options={"task": np.int64(2)})[1]["task"] == env.tasks[2].name


# ---------------------------------------------------------------- observations inside the space
def test_a_huge_statement_is_cut_and_the_prompt_keeps_its_call_menu():
    task = Task(name="big", statement="x " * 5_000_000, source="def big(n):\n    return n\n", defect="init",
                fix_op="fix_init", visible=(((1,), 1),), hidden=(((1,), 1), ((2,), 3)), split="custom")
    env = BugFixEnv(tasks=[task], render_mode="ansi")
    obs, _ = env.reset(seed=0)
    assert len(obs) == 4096 and env.observation_space.contains(obs)
    assert obs.startswith("fix the function big : x x ")
    assert obs.endswith(" ... . calls : " + bugfix_gym.core.tools.MENU)
    assert len(env.render()) < 5000


def test_observations_and_render_are_printable_and_carry_no_escape_sequences(hostile_task):
    env = BugFixEnv(tasks=[hostile_task], render_mode="ansi")
    obs, _ = env.reset(seed=0)
    seen = [obs]
    for action in ("read", "test", "edit fix_init", "dance\x1b[2J", "submit"):
        seen.append(env.step(action)[0])
    seen.append(env.render())
    for text in seen:
        assert env.observation_space.contains(text[:4096]), repr(text)
        assert not set(text) - set(string.printable) and not set(text) & set("\x1b\x07\r\x0b\x0c\x9b")
    assert "make it quiet ?[2J?]0;owned? ?31m ??? done ? ?" in seen[0]
    assert seen[1] == 'def loud(x):\n    return "?[31m" + x\n'  # CR LF lines read as lines


# ---------------------------------------------------------------- generated=: a fresh task every reset
def test_generated_mode_draws_a_fresh_task_every_reset_reproducibly():
    env = BugFixEnv(generated="train")
    assert env.tasks == [] and env.split == "generated"
    tasks = [env.reset(seed=s)[1]["task"] for s in range(30)]
    assert len(set(tasks)) == 30  # new identifiers every episode
    first = env.reset(seed=3)[0], env.task
    other = BugFixEnv(generated="train")
    assert (other.reset(seed=3)[0], other.task) == first  # reset(seed=s) reproduces the task
    assert first[1].name == tasks[3]
    kinds = set()
    for s in range(60):
        env.reset(seed=100 + s)
        kinds.add(env.task.fix_op)
        assert env.task.split == "train" and task_problems(env.task) == []
    assert kinds == set(bugfix_gym.FIX_OPS)  # every defect kind is drawn


def test_generated_mode_draws_from_the_named_template_split():
    env = BugFixEnv(generated="test")
    splits = set()
    for seed in range(10):
        env.reset(seed=seed)
        splits.add(env.task.split)
    assert splits == {"test"}


def test_ambiguous_share_draws_that_share_from_the_ambiguous_templates():
    from bugfix_gym.tasks.generator import AMBIGUOUS, TEMPLATES

    env = BugFixEnv(generated="train", ambiguous_share=0.5)
    keys = []
    for seed in range(200):
        env.reset(seed=seed)
        keys.append(env.task.template)
    share = sum(k in AMBIGUOUS for k in keys) / len(keys)
    # half the episodes from the 11 ambiguous templates, the other half from all 63 (some ambiguous too)
    expected = 0.5 + 0.5 * len(AMBIGUOUS) / len(TEMPLATES["train"])
    assert abs(share - expected) < 0.1 and len(set(keys) - set(AMBIGUOUS)) > 20


def test_inert_lines_add_one_statement_that_changes_no_op_site_test_or_fix():
    from bugfix_gym import FIX_OPS, apply_op
    from bugfix_gym.tasks.generator import NOUNS

    plain, noisy = BugFixEnv(generated="train"), InertLines(BugFixEnv(generated="train"), 1.0)
    changed = 0
    for seed in range(60):
        plain.reset(seed=seed)
        noisy.reset(seed=seed)
        a, b = plain.task, noisy.unwrapped.task
        same = ("name", "statement", "fix_op", "visible", "hidden")
        assert [getattr(b, k) for k in same] == [getattr(a, k) for k in same]
        added = [line for line in b.source.splitlines() if line not in a.source.splitlines()]
        if b.source != a.source:
            changed += 1
            assert len(b.source.splitlines()) == len(a.source.splitlines()) + 1 and len(added) == 1
            noun, _, param = added[0].strip().partition(" = ")
            assert noun in NOUNS and param in a.source.splitlines()[0]
        for op in FIX_OPS:  # every op finds a site in the same places
            assert (apply_op(a.source, op) == a.source) == (apply_op(b.source, op) == b.source)
        for call in ("test", f"edit {a.fix_op}", "submit"):  # the fix passes in both, with the same reports
            pa, pb = plain.step(call), noisy.step(call)
            assert pa[1:4] == pb[1:4] and (call == f"edit {a.fix_op}" or pa[0] == pb[0])
        assert pb[1] == 1.0
    assert 20 < changed < 60  # one-statement functions and guarded ones keep their shape
    zero = InertLines(BugFixEnv(generated="train"), 0.0)
    zero.reset(seed=5)
    plain.reset(seed=5)
    assert zero.unwrapped.task == plain.task and zero.np_random.random() == plain.np_random.random()  # 0 draws nothing


def test_statement_dropout_leaves_out_statement_words_and_nothing_else():
    from bugfix_gym.core import tools

    plain, dropped = BugFixEnv(generated="train"), StatementDropout(BugFixEnv(generated="train"), 0.5)
    kept = total = 0
    for seed in range(40):
        prompt, _ = plain.reset(seed=seed)
        short, _ = dropped.reset(seed=seed)
        task = dropped.unwrapped.task
        assert task == plain.task and prompt == tools.prompt(task)  # the same task; 0 changes nothing
        head, tail = f"fix the function {task.name} : ", f" . calls : {tools.MENU}"
        assert short.startswith(head) and short.endswith(tail)
        words, left = task.statement.split(), short[len(head):-len(tail)].split()
        it = iter(words)
        assert all(w in it for w in left)  # what is left is the statement in order, with words left out
        kept, total = kept + len(left), total + len(words)
        for call in ("read", "test", "edit fix_init", "submit"):  # tools, tests and reward unchanged
            a, b = plain.step(call), dropped.step(call)
            assert a[:4] == b[:4]
    assert 0.4 < kept / total < 0.6


def test_generated_tasks_stay_registered_only_while_recent(monkeypatch):
    from bugfix_gym.tasks import generator
    from bugfix_gym.tasks.library import REGISTRY

    monkeypatch.setattr(generator, "RECENT_LIMIT", 8)
    env = BugFixEnv(generated="heldout")
    env.reset(seed=0)
    before = len(REGISTRY)
    names = [env.reset(seed=s)[1]["task"] for s in range(1, 200)]
    assert len(REGISTRY) <= before + 2 * 8  # bounded: name and uid of at most 8 recent tasks
    assert get_task(names[-1]) is env.task  # the running episode's task is found by name
    assert names[0] not in REGISTRY  # an old one was dropped


def test_scripted_oracle_passes_generated_episodes():
    oracle = scripted_policy("oracle")
    env = BugFixEnv(generated="heldout")
    for seed in range(15):
        obs, info = env.reset(seed=seed)
        done = False
        while not done:
            obs, reward, terminated, truncated, info = env.step(oracle(obs, info))
            done = terminated or truncated
        assert reward == 1.0 and info["hidden_pass"] and info["actions"][1] == f"edit {env.task.fix_op}"


def test_generated_mode_still_plays_a_given_task_but_has_no_index():
    env = BugFixEnv(generated="train")
    assert env.reset(options={"task": "clamp"})[1]["task"] == "clamp"
    task = make_tasks("heldout")[0]
    assert env.reset(options={"task": task})[1]["task"] == task.name
    with pytest.raises(ValueError, match="generated='train' env has no task list to index; pass a task name"):
        env.reset(options={"task": 0})


# ---------------------------------------------------------------- HideOutputs and invalid_cost=
def _play_calls(env: gym.Env, calls) -> list:
    env.reset(options={"task": "clamp"})
    out = []
    for call in calls:
        obs, reward, terminated, truncated, info = env.step(call)
        out.append((obs, reward, terminated, truncated, info["valid"], info["n_invalid"], info["ops"]))
    return out


def test_hide_outputs_blanks_only_the_named_tools_and_changes_nothing_else():
    calls = ["read", "test", "dance", "edit swap_minmax", "test", "submit"]
    plain = _play_calls(BugFixEnv(), calls)
    hidden = _play_calls(HideOutputs(BugFixEnv(), ("read", "test")), calls)
    assert [h[0] for h in hidden] == ["output hidden", "output hidden", plain[2][0], plain[3][0], "output hidden",
                                      "hidden tests passed"]
    assert [h[1:] for h in hidden] == [p[1:] for p in plain]  # rewards, episode end, validity unchanged
    assert plain[0][0].startswith("def clamp") and plain[1][0].startswith("visible tests")
    read_only = _play_calls(HideOutputs(BugFixEnv(), ["read"]), calls[:2])
    assert read_only[0][0] == "output hidden" and read_only[1][0] == plain[1][0]


def test_invalid_cost_is_charged_on_each_invalid_step_only():
    env = BugFixEnv(call_cost=0.1, invalid_cost=0.5)
    calls = ["dance", "revert", "read" + " " * 400, "read", "edit swap_minmax", "submit"]
    got = [r for _, r, *_ in _play_calls(env, calls)]
    assert got == pytest.approx([-0.6, -0.6, -0.6, -0.1, -0.1, 0.9])
    plain = [r for _, r, *_ in _play_calls(BugFixEnv(), ["dance", "read", "edit swap_minmax", "submit"])]
    assert plain == [0.0, 0.0, 0.0, 1.0]  # off by default: an invalid call costs only its turn


def test_no_change_cost_is_charged_on_edits_that_change_nothing_only():
    # clamp's fix is swap_minmax; fix_init finds no site in it, so the tool answers "no change"
    calls = ["edit fix_init", "read", "edit swap_minmax", "edit fix_init", "submit"]
    env = BugFixEnv(no_change_cost=0.25, edit_penalty=0.1)
    steps = _play_calls(env, calls)
    assert [obs for obs, *_ in steps][0] == "no change"
    assert [r for _, r, *_ in steps] == pytest.approx([-0.35, 0.0, -0.1, -0.35, 1.0])
    plain = [r for _, r, *_ in _play_calls(BugFixEnv(), calls)]
    assert plain == [0.0, 0.0, 0.0, 0.0, 1.0]  # off by default


@pytest.mark.parametrize("kwargs", [dict(generated="train"), dict(generated="test", invalid_cost=0.2),
                                    dict(hide_outputs=["read", "test"], invalid_cost=0.1, call_cost=0.05),
                                    dict(generated="train", statement_dropout=0.3),
                                    dict(generated="train", inert_lines=0.5, no_change_cost=0.1)])
def test_check_env_passes_with_the_new_options(kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(gym.make("BugFix-v0", **kwargs).unwrapped, skip_render_check=False)
    assert [str(w.message) for w in caught] == []
    with warnings.catch_warnings(record=True) as caught:  # and with the wrappers those options apply
        warnings.simplefilter("always")
        check_env(gym.make("BugFix-v0", **kwargs), skip_render_check=False)
    assert [str(w.message) for w in caught if "is different from the unwrapped version" not in str(w.message)] == []
