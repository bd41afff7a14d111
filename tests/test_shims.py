"""The GEM, SkyRL-gym and OpenEnv shapes of BugFix (bugfix_gym.integrations.shims), which need none of those
libraries: each plays a BugFixEnv episode, scores what BugFixEnv scores and never raises on a bad reply."""

from __future__ import annotations

from bugfix_gym import CALLS, get_task
from bugfix_gym.integrations.shims import ROW_KEYS, GemBugFix, OpenEnvBugFix, SkyRLBugFix, call_from_reply
from bugfix_gym.integrations.trl import ENDED, BugFixToolEnv, dataset_rows

STEP_OUTPUT_KEYS = {"observations", "reward", "done", "metadata", "postprocessed_action"}
"""the keys of skyrl_gym.envs.base_text_env.BaseTextEnvStepOutput"""


def _wrong(op: str) -> str:
    return "fix_init" if op != "fix_init" else "swap_minmax"


def test_call_from_reply_takes_the_last_boxed_call_else_the_text():
    assert call_from_reply("I read first. \\boxed{read} then \\boxed{edit fix_init}") == "edit fix_init"
    assert call_from_reply("  submit \n") == "submit"


def test_gem_reset_is_seeded_and_a_boxed_fix_then_submit_passes():
    env = GemBugFix(split="train", seed=3)  # gem.make_vec passes seed to the constructor
    obs, info = env.reset(seed=7)
    assert env.reset(seed=7)[0] == obs and "suffix" in info
    fix = get_task(env.env.task.name).fix_op
    assert env.step(f"Let me fix it: \\boxed{{edit {fix}}}")[1:4] == (0.0, False, False)
    obs, reward, terminated, truncated, info = env.step("\\boxed{submit}")
    assert (reward, terminated, truncated, info["hidden_pass"]) == (1.0, True, False, True)
    env.reset(seed=7)
    *_, info = env.step("no call in here")
    assert info["valid"] is False and info["n_invalid"] == 1
    assert call_from_reply(env.sample_random_action()) in CALLS


def test_gem_generated_tasks_follow_the_seed():
    env = GemBugFix(split="heldout", generated=True)
    assert env.reset(seed=11)[0] == GemBugFix(split="heldout", generated=True).reset(seed=11)[0]


def test_skyrl_step_outputs_are_chat_messages_and_the_reward_is_the_hidden_tests():
    for k, row in enumerate(dataset_rows("train", n=2, seed=0)):
        env = SkyRLBugFix(None, {"extra_info": {key: row[key] for key in ROW_KEYS}, "max_turns": 4})
        chat, meta = env.init([{"role": "system", "content": "You fix code."}, {"role": "user", "content": ""}])
        assert [m["role"] for m in chat] == ["system", "user"] and chat[1]["content"].startswith("fix the function")
        fix = get_task(row["task"]).fix_op
        call = f"edit {fix if k == 0 else _wrong(fix)}"
        out = env.step(call)
        assert set(out) == STEP_OUTPUT_KEYS and out["done"] is False
        same = BugFixToolEnv()
        same.reset(**row)
        assert out["observations"] == [{"role": "user", "content": same.env.step(call)[0]}]
        out = env.step("submit")
        assert out["done"] is True and out["observations"] == [] and out["postprocessed_action"] == "submit"
        assert out["reward"] == (1.0 if k == 0 else 0.0) == env.get_metrics()["hidden_pass"]
        after = env.step("read")
        assert after["done"] is True and after["reward"] == 0.0 and after["metadata"]["stop"] == "submit"


def test_skyrl_budget_ends_the_episode_and_a_base_class_init_keeps_the_budget():
    class BaseTextEnvLike:  # what skyrl_gym's BaseTextEnv.__init__ sets
        def __init__(self):
            self.turns, self.max_turns, self.tool_groups = 0, 1, []

    class Env(SkyRLBugFix, BaseTextEnvLike):
        pass

    row = dataset_rows("train", n=1, seed=4)[0]
    env = Env(None, {key: row[key] for key in ROW_KEYS})
    assert env.max_turns == 6 and env.tool_groups == []
    env.init([{"role": "user", "content": ""}])
    outs = [env.step("???") for _ in range(6)]
    assert [o["done"] for o in outs] == [False] * 5 + [True] and outs[-1]["metadata"]["stop"] == "budget"
    assert env.get_metrics() == {"hidden_pass": 0.0, "turns": 6}


def test_openenv_core_returns_observation_and_state_fields():
    env = OpenEnvBugFix()
    first = env.reset(seed=2, episode_id="ep-1")
    assert set(first) == {"text", "done", "reward", "metadata"} and first["done"] is False
    assert env.reset(seed=2)["text"] == first["text"]
    env.reset(seed=2, episode_id="ep-1")
    fix = get_task(env.player.env.task.name).fix_op
    env.step(f"edit {fix}")
    last = env.step("submit")
    assert (last["done"], last["reward"]) == (True, 1.0) and env.state == {"episode_id": "ep-1", "step_count": 2}
    assert env.step("read")["text"] == ENDED
    row = dataset_rows("test", n=1, seed=0, tasks="generated")[0]
    assert env.reset(**row)["text"] == OpenEnvBugFix().reset(**row)["text"]
