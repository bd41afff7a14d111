"""The text env's wrappers (StatementDropout, InertLines, HideOutputs, ToolLatency): the same episodes as when
they were env options, the gym.make shim, their checks."""

from __future__ import annotations

import hashlib
import json

import gymnasium as gym
import numpy as np
import pytest

import bugfix_gym
import bugfix_gym.views.text_wrappers
from bugfix_gym import CALLS, BugFixEnv
from bugfix_gym.views.text_wrappers import HideOutputs, InertLines, StatementDropout, ToolLatency, make_bugfix_env
from bugfix_gym.views.wrappers import DiscreteCalls

WRAPPED_CONFIGS = [
    {"generated": "train", "statement_dropout": 0.3},
    {"generated": "train", "inert_lines": 0.5, "no_change_cost": 0.1},
    {"generated": "train", "inert_lines": 1.0, "statement_dropout": 0.5, "ambiguous_share": 0.3},
    {"generated": "test", "inert_lines": 0.7, "statement_dropout": 0.2, "hide_outputs": ["test"]},
    {"hide_outputs": ["read", "test"], "invalid_cost": 0.1, "call_cost": 0.05},
    {"statement_dropout": 0.5, "render_mode": "ansi", "tool_latency_s": 1e-6},
]
ODD_CALLS = ["dance", "", "edit nothing", "read   ", "revert"]

# sha256 of play_record(kwargs, 12, 100 * k) for WRAPPED_CONFIGS[k], recorded with the code of 4e10e0a, where these
# were BugFixEnv arguments (gym.make passed them to the env)
RECORDED_DIGESTS = [
    "23e99c4ee28c5b6bbb17eb92139e80df91a3ec3eec1b10b57394b4b43eef65a7",
    "f86ac231d60a616271cc9cf21ea5c8e4e275d3273048306aae9581451fa96446",
    "71e9c2a08d0fd0363ae469fcf19def526a3454662dc43e58d25422b141dc018b",
    "a5e3f557b3aa6775c23c9f1ee77056bb267471dfed5189b851271f2605f76c2a",
    "9f7172d893f5178ec54df8aed195de8dca00c835f1d516f923b111a039a1551d",
    "29a72ea1eeba218d032a940bf2ad44440c0a08777904ee972f7f85791d222424",
]


def _plain(x):
    """JSON-able: arrays and numpy numbers as Python lists and numbers."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.item() if isinstance(x, np.generic) else x


def play_record(kwargs: dict, n_episodes: int, seed: int, env: gym.Env | None = None) -> list:
    """Every observation, reward, end flag and info of ``n_episodes`` episodes of random calls (drawn apart from
    the env's stream), reseeded every fifth episode, then each episode's transcript, source, env random state
    and rendering: what two versions of the env must agree on."""
    env = gym.make("BugFix-v0", **kwargs) if env is None else env
    rng = np.random.default_rng(seed)
    record = []
    for episode in range(n_episodes):
        obs, info = env.reset(seed=seed + episode if episode % 5 == 0 else None)
        steps = [[obs, _plain(info)]]
        done = False
        while not done:
            odd = rng.random() >= 0.85
            action = ODD_CALLS[int(rng.integers(len(ODD_CALLS)))] if odd else CALLS[int(rng.integers(len(CALLS)))]
            obs, reward, terminated, truncated, info = env.step(action)
            steps.append([action, obs, reward, terminated, truncated, _plain(info)])
            done = terminated or truncated
        base = env.unwrapped
        steps.append([[list(s) for s in base.transcript], base.source, _plain(base.get_state()["np_random"]),
                      env.render() if kwargs.get("render_mode") else None])
        record.append(steps)
    return record


def _digest(record: list) -> str:
    return hashlib.sha256(json.dumps(record).encode()).hexdigest()


# ---------------------------------------------------------------- the same episodes as before
@pytest.mark.parametrize("k", range(len(WRAPPED_CONFIGS)))
def test_gym_make_with_the_wrapper_options_plays_the_episodes_the_env_options_played(k):
    assert _digest(play_record(WRAPPED_CONFIGS[k], 12, 100 * k)) == RECORDED_DIGESTS[k]


def test_wrappers_applied_by_hand_play_what_the_gym_make_shim_plays():
    kwargs = dict(generated="train", statement_dropout=0.4, inert_lines=0.6, hide_outputs=["read"])
    by_hand = StatementDropout(InertLines(HideOutputs(BugFixEnv(generated="train"), ["read"]), 0.6), 0.4)
    assert play_record(kwargs, 10, 7, env=by_hand) == play_record(kwargs, 10, 7)


def test_zero_options_apply_no_wrapper_and_the_views_take_the_options():
    assert type(make_bugfix_env(statement_dropout=0.0, inert_lines=0.0, hide_outputs=(), tool_latency_s=0.0)) is \
        BugFixEnv
    env = make_bugfix_env(generated="train", statement_dropout=0.3, inert_lines=0.5, hide_outputs=["test"],
                          tool_latency_s=0.01)
    assert [type(w) for w in _stack(env)] == [StatementDropout, InertLines, ToolLatency, HideOutputs, BugFixEnv]
    view = gym.make("BugFixCalls-v0", max_len=64, generated="train", statement_dropout=0.3, hide_outputs=["read"])
    assert [type(w) for w in _stack(view)][-4:] == [DiscreteCalls, StatementDropout, HideOutputs, BugFixEnv]
    view.reset(seed=0)
    assert view.step(CALLS.index("read"))[4]["valid"] and view.unwrapped.transcript[-1][1] == "output hidden"


def _stack(env: gym.Env) -> list[gym.Env]:
    """The wrappers of ``env``, outermost first, then the env."""
    out = [env]
    while isinstance(out[-1], gym.Wrapper):
        out.append(out[-1].env)
    return out


def test_spec_rebuilds_the_same_stack_without_wrapping_twice():
    env = gym.make("BugFix-v0", generated="train", statement_dropout=0.3, inert_lines=0.5)
    rebuilt = env.spec.make()
    assert [type(w) for w in _stack(rebuilt)] == [type(w) for w in _stack(env)]
    assert rebuilt.get_wrapper_attr("statement_dropout") == 0.3 and rebuilt.get_wrapper_attr("inert_lines") == 0.5
    assert play_record({}, 4, 3, env=rebuilt) == play_record({}, 4, 3, env=env)


# ---------------------------------------------------------------- what each wrapper does
def test_hide_outputs_puts_its_handler_in_the_env_table_of_tools():
    env = HideOutputs(BugFixEnv(), ["test"])
    assert env.unwrapped.tools["test"] is bugfix_gym.views.text_wrappers.hidden_output
    assert env.unwrapped.tools["read"] == env.unwrapped._read and env.hide_outputs == ("test",)
    assert HideOutputs(BugFixEnv()).hide_outputs == ("read", "test")  # both hideable tools by default


def test_tool_latency_sleeps_on_valid_test_and_submit_calls_only(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(bugfix_gym.views.text_wrappers.time, "sleep", slept.append)
    env = ToolLatency(BugFixEnv(), 0.02)
    env.reset(seed=0)
    for call in ["read", "test", "tset", "edit fix_init", "revert", "submit"]:
        env.step(call)
    assert slept == [0.02, 0.02]
    env.reset(seed=0)
    env.step("test")
    assert len(slept) == 3
    assert ToolLatency(BugFixEnv()).tool_latency_s == 0.0
    made = gym.make("BugFix-v0", tool_latency_s=0.02)
    made.set_wrapper_attr("tool_latency_s", 0.03)  # as benchmarks/scale_out.py sets it in running envs
    made.reset(seed=0)
    made.step("test")
    assert slept[-1] == 0.03 and len(slept) == 4


@pytest.mark.parametrize("bad, error", [(-0.1, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                                        ("0.02", TypeError), (None, TypeError)])
def test_tool_latency_must_be_a_finite_number_of_seconds(bad, error):
    with pytest.raises(error, match="tool_latency_s must be a finite number >= 0"):
        ToolLatency(BugFixEnv(), bad)
    with pytest.raises(error, match="tool_latency_s must be a finite number >= 0"):
        make_bugfix_env(tool_latency_s=bad)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(statement_dropout=1.0), ValueError, r"statement_dropout is a probability in \[0, 1\)"),
    (dict(statement_dropout=-0.1), ValueError, "statement_dropout must be a finite number >= 0"),
    (dict(inert_lines=1.5), ValueError, r"inert_lines is a probability in \[0, 1\]"),
    (dict(hide_outputs="read"), TypeError, r"hide_outputs must be a list of tool names such as \['read', 'test'\]"),
    (dict(hide_outputs=["read", "edit"]), ValueError, "hide_outputs can name only 'read', 'test', got 'edit'"),
])
def test_bad_wrapper_options_give_one_clear_line(kwargs, error, message):
    with pytest.raises(error, match=message) as exc_info:
        make_bugfix_env(**kwargs)
    assert "\n" not in str(exc_info.value) and len(str(exc_info.value)) < 300
    ((name, value),) = kwargs.items()
    wrapper = {"statement_dropout": StatementDropout, "inert_lines": InertLines, "hide_outputs": HideOutputs}[name]
    with pytest.raises(error, match=message):
        wrapper(BugFixEnv(), value)


@pytest.mark.parametrize("wrapper, arg", [(StatementDropout, 0.3), (InertLines, 0.3), (HideOutputs, ["read"]),
                                          (ToolLatency, 0.01)])
def test_the_wrappers_wrap_only_the_text_env(wrapper, arg):
    with pytest.raises(TypeError, match=f"{wrapper.__name__} wraps the text env BugFix-v0 .apply it before the "
                                        "array views"):
        wrapper(DiscreteCalls(BugFixEnv()), arg)
    with pytest.raises(TypeError, match=f"{wrapper.__name__} wraps the text env BugFix-v0"):
        wrapper(gym.make("LookThenAnswer-v0"), arg)
