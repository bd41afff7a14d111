"""Numeric views: SB3 check_env, owner codes from who produced each token, call masks, overflow."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from bugfix_gym import CALLS, BugFixEnv, build_tokenizer, encode_segment, episode_tokens, generate_tasks, get_task
from bugfix_gym.views.wrappers import DiscreteCalls, TokenObservation, TokenView

TOK = build_tokenizer()


def _ids(text: str) -> list[int]:
    return TOK.encode(text)


@pytest.mark.parametrize("wrapper", [TokenObservation, DiscreteCalls])
def test_both_views_pass_sb3_check_env_without_warnings(wrapper):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check_env(wrapper(gym.make("BugFix-v0")))
    assert [str(w.message) for w in caught] == []


@pytest.mark.parametrize("wrapper", [TokenObservation, DiscreteCalls])
def test_both_views_pass_gymnasium_check_env_and_rebuild_from_their_spec(wrapper):
    from gymnasium.utils.env_checker import check_env

    env = wrapper(gym.make("BugFix-v0").unwrapped, max_len=300)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(env)
    assert [str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)] == []
    rebuilt = env.spec.make()  # the wrapper records its constructor arguments, as gymnasium's own do
    assert type(rebuilt) is wrapper and rebuilt.observation_space == env.observation_space


def test_token_observation_decodes_ids_up_to_eoc_and_records_exactly_the_given_ids():
    env = TokenObservation(BugFixEnv(), TOK, max_len=256, max_call_tokens=8)
    obs, info = env.reset(options={"task": "clamp"})
    n_prompt = int(obs["attention_mask"].sum())
    assert (obs["owner"][:n_prompt] == 1).all() and (obs["owner"][n_prompt:] == 0).all()
    assert (obs["ids"][n_prompt:] == TOK.pad_id).all()
    junk = _ids("read test")
    action = np.array(_ids("edit swap_minmax") + [TOK.eoc_id] + junk + [TOK.eoc_id] * 3, dtype=np.int64)
    obs, reward, term, trunc, info = env.step(action)
    assert info["last_call"] == CALLS.index("edit swap_minmax") and info["n_edits"] == 1
    assert env.unwrapped.actions == ["edit swap_minmax"] and env.unwrapped.ops == ["swap_minmax"]
    policy = obs["ids"][obs["owner"] == 2].tolist()
    assert policy == _ids("edit swap_minmax") + [TOK.eoc_id]  # what the agent gave, up to and including <eoc>
    tool = obs["ids"][obs["owner"] == 3].tolist()
    assert tool == encode_segment(TOK, 3, env.unwrapped.transcript[-1][1])
    owner = obs["owner"][: int(obs["attention_mask"].sum())].tolist()
    assert owner == [1] * n_prompt + [2] * len(policy) + [3] * len(tool)


def test_token_observation_pad_and_missing_terminators():
    env = TokenObservation(BugFixEnv(), TOK, max_call_tokens=4)
    env.reset(options={"task": "clamp"})
    obs, *_, info = env.step(np.array([*_ids("read"), TOK.pad_id, *_ids("test"), TOK.eoc_id]))
    assert info["last_call"] == CALLS.index("read") and info["valid"]
    assert obs["ids"][obs["owner"] == 2].tolist() == [*_ids("read"), TOK.pad_id]  # pad as given, owner 2
    obs, *_, info = env.step(np.array(_ids("read read read read")))  # no terminator: all four ids are the call
    assert info["last_call"] == -1 and not info["valid"]
    assert env.unwrapped.actions[-1] == "read read read read"
    assert obs["ids"][obs["owner"] == 2].tolist()[-4:] == _ids("read read read read")
    obs, *_, info = env.step(np.array([TOK.unk_id, TOK.eoc_id, 0, 0]))
    assert info["last_call"] == -1 and env.unwrapped.actions[-1] == "<unk>" and info["n_invalid"] == 2


def test_token_observation_rejects_non_integer_and_out_of_vocabulary_actions():
    env = TokenObservation(BugFixEnv(), TOK, max_call_tokens=4)
    env.reset(seed=0)
    for bad in ("read", np.array([1.0, 2.0]), np.array([[1, 2]]), np.array([], dtype=np.int64)):
        with pytest.raises(TypeError, match="1-d integer arrays"):
            env.step(bad)
    for bad in ([TOK.vocab_size, 0], [-1, 2]):
        with pytest.raises(ValueError, match=f"0..{TOK.vocab_size - 1}"):
            env.step(np.array(bad))
    obs, *_, info = env.step([TOK.ids["read"], TOK.eoc_id])  # a plain list of ints is fine
    assert info["last_call"] == 0 and env.observation_space.contains(obs)


def test_owner_codes_come_from_the_producer_not_the_token_id():
    env = DiscreteCalls(BugFixEnv(), TOK)
    obs, _ = env.reset(options={"task": "clamp"})
    read_id = TOK.ids["read"]
    assert read_id in obs["ids"][obs["owner"] == 1]  # the prompt's call menu says 'read'
    obs, *_ = env.step(CALLS.index("read"))
    assert obs["ids"][obs["owner"] == 2].tolist() == [read_id, TOK.eoc_id]  # the same id, now the policy's
    assert set(np.unique(obs["owner"][obs["ids"] == read_id])) == {1, 2}


def test_discrete_view_matches_the_contract_episode_tokens():
    env = DiscreteCalls(BugFixEnv(), TOK, max_len=512)
    env.reset(options={"task": "spread"})
    for call in ("read", "test", "edit swap_minmax", "revert", "edit fix_init", "submit"):
        obs, *_ = env.step(CALLS.index(call))
    ids, owner = episode_tokens(env.unwrapped.transcript, TOK)
    n = len(ids)
    assert obs["ids"][:n].tolist() == ids.tolist() and obs["owner"][:n].tolist() == owner.tolist()
    assert obs["attention_mask"].tolist() == [1] * n + [0] * (512 - n)


def test_action_mask_and_action_masks_follow_the_legal_calls():
    env = DiscreteCalls(BugFixEnv(), TOK)
    obs, info = env.reset(options={"task": "clamp"})
    revert = CALLS.index("revert")
    assert obs["action_mask"].dtype == bool and not obs["action_mask"][revert] and obs["action_mask"].sum() == 8
    assert env.action_masks().tolist() == obs["action_mask"].tolist() == info["call_mask"].tolist()
    obs, *_ = env.step(CALLS.index("edit swap_minmax"))
    assert obs["action_mask"].all() and env.action_masks().all()
    obs, *_, info = env.step(revert)
    assert info["valid"] and obs["action_mask"][revert] == 0 and not env.action_masks()[revert]
    masks = env.action_masks()
    masks[:] = False
    assert env.action_masks().sum() == 8  # a copy each call


def test_the_useful_calls_mask_closes_an_edit_that_changed_nothing():
    env = DiscreteCalls(BugFixEnv(), TOK, mask="useful_calls")
    env.reset(options={"task": "clamp"})
    obs, *_, info = env.step(CALLS.index("edit fix_init"))  # clamp has no accumulator: no change
    closed = [c for c, ok in zip(CALLS, env.action_masks()) if not ok]
    assert closed == ["edit fix_init", "revert"] and obs["action_mask"].tolist() == info["useful_calls"].tolist()
    assert info["call_mask"][CALLS.index("edit fix_init")]  # still legal: the env does not enforce the advice
    with pytest.raises(ValueError, match="mask must be"):
        DiscreteCalls(BugFixEnv(), TOK, mask="legal")


def test_discrete_calls_rejects_non_integer_and_out_of_range_actions():
    env = DiscreteCalls(BugFixEnv(), TOK)
    env.reset(seed=0)
    for bad in ("read", 1.0, None, True, np.array([1, 2])):
        with pytest.raises(TypeError, match="call indices"):
            env.step(bad)
    with pytest.raises(ValueError, match="0..8"):
        env.step(9)
    obs, *_, info = env.step(np.int64(0))
    assert info["last_call"] == 0 and env.unwrapped.actions == ["read"]


def test_observations_are_fresh_arrays_each_step():
    env = DiscreteCalls(BugFixEnv(), TOK)
    obs0, _ = env.reset(seed=0)
    obs0["ids"][:] = 7
    obs0["action_mask"][:] = 0
    obs1, *_ = env.step(0)
    assert not (obs1["ids"] == 7).all() and obs1["action_mask"].sum() == 8
    assert all(np.shares_memory(obs1[k], obs0[k]) is False for k in obs1)


def test_overflow_keeps_the_prompt_and_the_latest_tokens():
    view = TokenView(TOK, max_len=10)
    view.reset([11, 12, 13])
    view.add(2, [21, 22, TOK.eoc_id])
    view.add(3, list(range(31, 40)))
    arrays = view.arrays()
    assert arrays["ids"].tolist() == [11, 12, 13, 33, 34, 35, 36, 37, 38, 39] and view.n_dropped == 5
    assert arrays["owner"].tolist() == [1, 1, 1] + [3] * 7 and arrays["attention_mask"].all()
    long_prompt = TokenView(TOK, max_len=6)
    long_prompt.reset(list(range(100, 110)))
    long_prompt.add(2, [5, TOK.eoc_id])
    assert long_prompt.arrays()["ids"].tolist() == [100, 101, 102, 109, 5, TOK.eoc_id]  # half prompt, then latest

    env = DiscreteCalls(BugFixEnv(), TOK, max_len=64)
    obs, info = env.reset(options={"task": "factorial"})
    for _ in range(3):
        obs, *_, info = env.step(CALLS.index("read"))
    assert info["n_dropped_tokens"] > 0 and obs["attention_mask"].all()
    latest = [TOK.encode(get_task("factorial").source)[-1], TOK.turn_id]
    assert obs["ids"][-2:].tolist() == latest  # the latest tool output (and its <turn>) is kept


def test_default_tokenizer_of_generated_tasks_is_the_fixed_vocabulary():
    from bugfix_gym import fixed_tokenizer

    tasks = generate_tasks("heldout", 5, seed=3)
    env = TokenObservation(BugFixEnv(tasks=tasks))
    fixed = fixed_tokenizer()
    assert env.tokenizer == fixed and env.tokenizer.vocab_size > TOK.vocab_size
    obs, _ = env.reset(seed=0)
    prompt = obs["ids"][obs["owner"] == 1].tolist()
    assert prompt[len(fixed.encode("fix the function"))] == fixed.unk_id  # the generated name is <unk>
    assert env.unwrapped.task.name not in fixed.ids
    assert TokenObservation(BugFixEnv(generated="train")).tokenizer == fixed
    assert TokenObservation(BugFixEnv()).tokenizer == TOK  # the book's tasks keep the book tokenizer
    with pytest.raises(TypeError, match="wrap the text env"):
        DiscreteCalls(env)


def test_token_view_works_in_sb3_vector_envs_and_maskable_ppo_learns_a_few_steps():
    from sb3_contrib import MaskablePPO
    from stable_baselines3.common.env_util import make_vec_env

    venv = make_vec_env(lambda: DiscreteCalls(gym.make("BugFix-v0"), max_len=128), n_envs=2, seed=0)
    model = MaskablePPO("MultiInputPolicy", venv, n_steps=16, batch_size=16, n_epochs=1, seed=0, device="cpu")
    model.learn(32)
    assert model.num_timesteps >= 32
    obs = venv.reset()
    masks = np.stack(venv.env_method("action_masks"))
    actions, _ = model.predict(obs, action_masks=masks, deterministic=True)
    assert all(masks[i, a] for i, a in enumerate(actions))
