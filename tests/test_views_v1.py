"""BugFix-v1's array views: the byte tokenizer, the factorised heads' masks against the env's legal calls, both views
under gymnasium's check_env, and sb3-contrib's MaskablePPO on the heads."""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

import bugfix_gym  # noqa: F401 (registers the envs)
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_TOOL, tokenizer_from_dict
from bugfix_gym.core.calls_v1 import CALL_KINDS
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.views.heads_v1 import (HEAD_SIZES, HEADS, V1_VIEW_INFO_KEYS, ByteTokenCalls, FactorisedCalls,
                                       LegalHeads)


@pytest.fixture(scope="module")
def text_env():
    return BugFixEnvV1(split="test")


def _calls_view(text_env, **kwargs):
    return FactorisedCalls(text_env, max_len=kwargs.pop("max_len", 256), **kwargs)


def _reachable(view: FactorisedCalls) -> set[str]:
    """Every call an autoregressive policy can play by choosing heads in order under head_masks."""
    found: set[str] = set()

    def visit(prefix: list[int]) -> None:
        if len(prefix) == len(HEADS):
            found.add(view.call_text(prefix))
            return
        for i in np.flatnonzero(view.head_masks(prefix)):
            visit(prefix + [int(i)])

    visit([])
    return found


def test_byte_tokenizer_round_trips_real_code_with_no_unknown_id():
    tok = ByteTokenizer()
    source = 'def count_vowels(s: str) -> int:\n    return sum(c in "aeiou\u00e9" for c in s.lower())\n'
    ids = tok.encode(source)
    assert tok.decode(ids) == source and len(ids) == len(source.encode()) and tok.unk_id not in ids
    assert min(ids) >= 3 and max(ids) < tok.vocab_size == 259
    assert tok.segment_ids(OWNER_POLICY, "read") == tok.encode("read") + [tok.eoc_id]
    assert tok.segment_ids(OWNER_TOOL, "ok") == tok.encode("ok") + [tok.turn_id]
    assert tok.decode(tok.encode("a") + [tok.eoc_id] + tok.encode("b")) == "a"
    assert tok.decode([3 + 0xC3]) == "\ufffd"  # half a character decodes, replaced
    assert tokenizer_from_dict(tok.to_dict()) == tok


@pytest.mark.parametrize("task", [0, 7, 31])
def test_head_masks_in_order_reach_exactly_the_env_s_legal_calls(text_env, task):
    view = _calls_view(text_env)
    view.reset(seed=0, options={"task": task})
    assert _reachable(view) == set(text_env.legal_calls())
    view.step(view.sample_legal(np.random.default_rng(task)))  # and after a legal call has changed the state
    if text_env.stop is None:
        assert _reachable(view) == set(text_env.legal_calls())


def test_each_head_projection_opens_exactly_the_indices_some_legal_call_uses(text_env):
    view = _calls_view(text_env)
    view.reset(seed=1, options={"task": 3})
    used = [set() for _ in HEADS]

    def visit(prefix: list[int]) -> None:
        if len(prefix) == len(HEADS):
            for head, index in enumerate(prefix):
                used[head].add(index)
            return
        for i in np.flatnonzero(view.head_masks(prefix)):
            visit(prefix + [int(i)])

    visit([])
    flat = view.action_masks()
    starts = np.cumsum((0,) + HEAD_SIZES)
    for head in range(len(HEADS)):
        assert set(np.flatnonzero(flat[starts[head]: starts[head + 1]])) == used[head], HEADS[head]


def test_patch_and_insert_are_masked_and_played_as_invalid_calls_not_errors(text_env):
    view = _calls_view(text_env)
    view.reset(seed=0, options={"task": 2})
    kinds = view.head_masks(())
    assert not kinds[CALL_KINDS.index("patch")] and not kinds[CALL_KINDS.index("insert")]
    assert kinds[CALL_KINDS.index("read")] and not kinds[CALL_KINDS.index("revert")]
    obs, reward, terminated, truncated, info = view.step(np.array([CALL_KINDS.index("patch"), 0, 0, 0, 0]))
    assert not info["valid"] and not info["legal_action"] and info["n_invalid"] == 1 and reward == 0.0
    assert text_env.source == text_env.task.source
    with pytest.raises(ValueError, match="below"):
        view.step(np.array([0, 64, 0, 0, 0]))
    with pytest.raises(TypeError, match="5 integer head indices"):
        view.step("read")


def test_a_mutation_without_argument_ignores_the_arg_head():
    heads = LegalHeads("def f(x):\n    return x + 1\n", [True] * len(CALL_KINDS))
    edit = CALL_KINDS.index("edit")
    line = 1  # line 2: return x + 1
    expr = next(int(k) for k in np.flatnonzero(heads.next_mask([edit, line]))
                if heads.edits[(2, int(k))].get("plus1") == (None,))
    mutation = bugfix_gym.edits.sites.MUTATION_INDEX["plus1"]
    assert np.flatnonzero(heads.next_mask([edit, line, expr, mutation])).tolist() == [0]
    assert heads.call([edit, line, expr, mutation, 17]) == f"edit 2.{expr} plus1"
    assert heads.is_legal([edit, line, expr, mutation, 17])
    broken = LegalHeads("def f(x:\n", [True] * len(CALL_KINDS))
    assert not broken.kinds[edit] and not broken.kinds[CALL_KINDS.index("delete")]


@pytest.mark.parametrize("make", [lambda env: FactorisedCalls(env, max_len=256),
                                  lambda env: ByteTokenCalls(env, max_len=256)])
def test_both_views_pass_gymnasium_and_sb3_check_env_without_warnings(make):
    from stable_baselines3.common.env_checker import check_env as sb3_check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        check_env(make(BugFixEnvV1(split="test")), skip_render_check=True)
        sb3_check_env(make(BugFixEnvV1(split="test")))
    assert [str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)] == []


def test_both_views_are_registered_with_their_info_keys():
    calls = gym.make("BugFixCalls-v1", max_len=256, split="test")
    tokens = gym.make("BugFixTokens-v1", max_len=256, split="test")
    for env in (calls, tokens):
        obs, info = env.reset(seed=4)
        assert set(V1_VIEW_INFO_KEYS) <= set(info) and env.observation_space.contains(obs)
        assert 0 <= info["task_index"] < len(env.unwrapped.tasks)
    assert calls.action_space.nvec.tolist() == list(HEAD_SIZES)
    assert tokens.action_space.nvec.tolist() == [259] * 64


@pytest.mark.parametrize("layout, keys", [("tianshou", {"obs", "mask"}), ("rllib", {"observations", "action_mask"})])
def test_layouts_put_the_flat_mask_under_each_library_s_key(text_env, layout, keys):
    view = _calls_view(text_env, layout=layout)
    obs, info = view.reset(seed=0, options={"task": 5})
    assert set(obs) == keys and view.observation_space.contains(obs)
    mask = obs["mask" if layout == "tianshou" else "action_mask"]
    assert np.array_equal(mask, view.action_masks()) and mask.shape == (sum(HEAD_SIZES),)
    assert np.array_equal(np.concatenate([info[f"{h}_head_mask"] for h in HEADS]), mask)


def test_byte_token_view_writes_a_patch_with_the_function_s_own_identifiers(text_env):
    view = ByteTokenCalls(text_env, max_len=512, max_call_tokens=96)
    view.reset(seed=0, options={"task": 0})
    line, code = next((k + 1, text.strip()) for k, text in enumerate(text_env.source.splitlines())
                      if text.strip().startswith("return"))
    obs, _, _, _, info = view.step(view.encode_call(f"patch {line} {code}"))
    assert info["valid"] and text_env.actions[-1] == f"patch {line} {code}"
    assert ByteTokenizer().decode(obs["ids"][obs["owner"] == OWNER_POLICY]) == f"patch {line} {code}"
    with pytest.raises(ValueError, match="raise max_call_tokens"):
        view.encode_call("patch 1 " + "x" * 100)


@pytest.mark.parametrize("steps", [64, pytest.param(320, marks=pytest.mark.slow)])
def test_maskable_ppo_runs_on_the_heads_and_samples_only_open_indices(text_env, steps):
    sb3_contrib = pytest.importorskip("sb3_contrib")
    import torch

    torch.set_num_threads(1)
    view = _calls_view(text_env, max_len=128)
    seen: list[tuple[np.ndarray, np.ndarray]] = []
    step = view.step

    def recording_step(action):
        seen.append((np.asarray(action).copy(), view.action_masks()))
        return step(action)

    view.step = recording_step  # type: ignore[method-assign]
    model = sb3_contrib.MaskablePPO("MultiInputPolicy", view, n_steps=32, batch_size=32, n_epochs=1, seed=0,
                                    policy_kwargs={"net_arch": [32]})
    model.learn(steps)
    assert len(seen) >= steps
    starts = np.cumsum((0,) + HEAD_SIZES)
    for action, mask in seen:
        assert all(mask[starts[h] + action[h]] for h in range(len(HEADS))), action


@pytest.mark.slow
def test_torchrl_wraps_the_vector_calls_view_and_stacks_its_info():
    pytest.importorskip("torchrl")
    import torch
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    envs = gym.make_vec("BugFixCalls-v1", num_envs=2, vectorization_mode="sync", max_len=64, split="test",
                        max_turns=3, vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})
    env = GymWrapper(envs)
    check_env_specs(env)
    rollout = env.rollout(6, break_when_any_done=False)  # past the 3-turn budget: autoresets included
    assert rollout.batch_size == (2, 6) and rollout["next", "done"].squeeze(-1).any(dim=1).all()
    assert rollout["next", "arg_head_mask"].shape == (2, 6, HEAD_SIZES[-1])
    assert rollout["next", "legal_action"].dtype == torch.bool and rollout["action_mask"].dtype == torch.bool
    env.close()
