"""BugFixEnv: gymnasium conventions, registration, vector envs, rewards, info, bounded execution."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import bugfix_gym
from bugfix_gym import CALLS, BugFixEnv, get_task, make_tasks
from bugfix_gym.execution import run_cases
from bugfix_gym.tasks import task_from_correct

INFO_KEYS = {"task", "turn", "n_turns", "actions", "ops", "n_invalid", "valid", "submitted", "hidden_pass", "stop",
             "call_mask"}


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
    async_ = _vector_rollout("async", shared_memory=False)  # SPEC §3: shared memory returns stale Text
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


def test_tools_report_source_tests_and_changes():
    env = BugFixEnv()
    task = get_task("clamp")
    env.reset(options={"task": task})
    assert env.step("read")[0] == task.source
    obs = env.step("test")[0]
    assert obs.startswith(f"visible tests : ") and f"/ {len(task.visible)} passed" in obs
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


def test_render_ansi_shows_the_transcript_and_bad_render_mode_is_rejected():
    env = BugFixEnv(render_mode="ansi")
    env.reset(options={"task": "clamp"})
    env.step("read")
    text = env.render()
    assert "[turn 1/6]" in text and ">>> read" in text and "def clamp" in text
    with pytest.raises(ValueError, match="render_mode"):
        BugFixEnv(render_mode="rgb_array")
    with pytest.raises(ValueError, match="max_turns"):
        BugFixEnv(max_turns=0)


def test_an_infinite_loop_fails_with_timeout_instead_of_hanging():
    start = time.perf_counter()
    report = run_cases("def spin(n):\n    while True:\n        n += 1\n", "spin", [((1,), 2), ((2,), 3)])
    assert report.passed == 0 and report.total == 2 and "raised Timeout" in report.first_failure
    assert time.perf_counter() - start < 5


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
    start = time.perf_counter()
    env.reset(seed=0)
    assert "raised Timeout" in env.step("test")[0]
    env.step("edit fix_comparison")
    assert env.step("test")[0] == f"visible tests : {len(task.visible)} / {len(task.visible)} passed"
    env.step("edit fix_comparison")  # spins again
    obs, reward, *_ = env.step("submit")
    assert reward == 0.0 and obs.startswith("hidden tests failed : 0 /")
    assert time.perf_counter() - start < 10


def test_package_exports_match_the_contract():
    for name in ("BugFixEnv", "make_tasks", "get_task", "build_tokenizer", "encode_segment", "episode_tokens",
                 "scripted_policy", "evaluate", "episode_stats", "parse_call", "CALLS", "FIX_OPS", "OWNER_PAD",
                 "OWNER_PROMPT", "OWNER_POLICY", "OWNER_TOOL", "generate_tasks", "load_task_pack"):
        assert hasattr(bugfix_gym, name), name
    assert len(CALLS) == 9 and len(set(CALLS)) == 9
    assert (bugfix_gym.OWNER_PAD, bugfix_gym.OWNER_PROMPT, bugfix_gym.OWNER_POLICY, bugfix_gym.OWNER_TOOL) == (0, 1, 2, 3)


def test_throughput_benchmark_runs_and_reports_a_ratio(capsys):
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "env_throughput.py"
    spec = importlib.util.spec_from_file_location("env_throughput", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--steps", "300", "--repeats", "1"])
    assert result["ratio"] > 0 and result["BugFix-v0 (uncached)"] < result["BugFix-v0 (cached)"]
    assert "BugFix-v0 / CartPole-v1 ratio of medians" in capsys.readouterr().out


def test_invalid_cost_and_blank_tools_options():
    env = BugFixEnv(invalid_cost=0.25)
    env.reset(options={"task": "clamp"})
    _, reward, *_ = env.step("revert")  # nothing to revert: invalid
    assert reward == -0.25
    _, reward, *_ = env.step("read")
    assert reward == 0.0
    _, reward, *_ = env.step("edit nothing")
    assert reward == -0.25
    blank = BugFixEnv(blank_tools=True)
    blank.reset(options={"task": "clamp"})
    assert blank.step("read")[0] == "hidden" and blank.step("test")[0] == "hidden"
    assert blank.step("edit swap_minmax")[0].startswith("changed line")
    obs, reward, terminated, *_ = blank.step("submit")
    assert terminated and reward == 1.0 and obs == "hidden tests passed"
