"""Rollouts: owner codes and the action mask, sample_logp parity, reward alignment, seeding."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from agents_fixtures import base_agent, tok  # noqa: F401  (pytest fixtures)

import bugfix_gym
from agents.model import TinyAgent, TinyAgentConfig, sequence_log_probs, sequence_logp_values_entropy
from agents.rollout import Trajectory, collate, rollout_batch, rollout_stats, scripted_rollout

TRAIN = [t.name for t in bugfix_gym.make_tasks("train")]


def _sample(model, tok, tasks, seed=0, **kw) -> list[Trajectory]:
    envs = [bugfix_gym.BugFixEnv() for _ in tasks]
    return rollout_batch(model, envs, tasks, tok, generator=torch.Generator().manual_seed(seed), **kw)


@pytest.fixture(scope="module")
def base_trajs(base_agent, tok):  # noqa: F811
    """Base-agent episodes: real calls of varied length, reads, tests, submits."""
    return _sample(base_agent, tok, TRAIN[:8] * 4, seed=3)


def _calls(traj: Trajectory) -> list[list[int]]:
    """The policy segments (maximal runs of owner 2) of a trajectory, as id lists."""
    calls, cur = [], []
    for i, o in zip(traj.ids.tolist(), traj.owner.tolist()):
        if o == 2:
            cur.append(i)
        elif cur:
            calls.append(cur)
            cur = []
    return calls + ([cur] if cur else [])


def test_trajectory_fields_and_action_mask(base_trajs, tok):  # noqa: F811
    for tr in base_trajs:
        T = len(tr)
        assert tr.ids.shape == tr.owner.shape == (T,)
        for x in (tr.action_mask, tr.sample_logp, tr.values, tr.token_rewards):
            assert x.shape == (T - 1,)
        assert torch.equal(tr.action_mask, (tr.owner[1:] == 2).float())  # mask = owner == 2, shifted
        assert tr.owner[0] == 1 and set(tr.owner.tolist()) <= {1, 2, 3}
        assert (tr.sample_logp[tr.action_mask == 0] == 0).all() and (tr.sample_logp[tr.action_mask == 1] < 0).all()
        assert T <= 512


def test_policy_segments_are_the_calls_the_env_received(base_trajs, tok):  # noqa: F811
    for tr in base_trajs:
        calls = _calls(tr)
        assert len(calls) == tr.info["n_turns"]
        assert [tok.decode(c) for c in calls] == tr.info["actions"]
        for c in calls:  # a call ends at <eoc> or at the length cap, never has <eoc> inside
            assert (c[-1] == tok.eoc_id or len(c) == 8) and tok.eoc_id not in c[:-1]


def test_tool_tokens_are_the_env_outputs(base_trajs, tok):  # noqa: F811
    """Replaying the calls through a fresh env gives the same token sequence."""
    for tr in base_trajs[:10]:
        env = bugfix_gym.BugFixEnv()
        env.reset(options={"task": tr.task})
        for action in tr.info["actions"]:
            env.step(action)
        ids, owner = bugfix_gym.episode_tokens(env.transcript, tok)
        assert np.array_equal(ids, tr.ids.numpy()) and np.array_equal(owner, tr.owner.numpy())


def test_sample_logp_and_values_match_recomputation_on_the_collated_batch(base_trajs, base_agent, tok):  # noqa: F811
    batch = collate(base_trajs, tok.pad_id)
    with torch.no_grad():
        logp, values, _ = sequence_logp_values_entropy(base_agent, batch["ids"])
        logp2 = sequence_log_probs(base_agent, batch["ids"])
    mask, real = batch["action_mask"], (batch["owner"][:, 1:] > 0).float()
    assert mask.sum() > 100
    assert ((logp - batch["sample_logp"]) * mask).abs().max() < 1e-5  # first PPO ratio is exactly 1
    assert ((logp2 - batch["sample_logp"]) * mask).abs().max() < 1e-5
    assert ((values - batch["values"]) * real).abs().max() < 1e-5


def test_rewards_sit_on_the_position_predicting_each_calls_last_token(base_trajs):
    assert any(tr.reward > 0 for tr in base_trajs)
    for tr in base_trajs:
        assert abs(float(tr.token_rewards.sum()) - tr.reward) < 1e-6
        for t in torch.nonzero(tr.token_rewards).flatten().tolist():
            assert tr.owner[t + 1] == 2 and (t + 2 == len(tr) or tr.owner[t + 2] != 2)
        assert tr.reward == float(tr.info["submitted"] and tr.info["hidden_pass"])


def test_collate_pads_right(base_trajs, tok):  # noqa: F811
    batch = collate(base_trajs, tok.pad_id)
    B, T = batch["ids"].shape
    assert B == len(base_trajs) and T == max(len(t) for t in base_trajs)
    for k in ("action_mask", "sample_logp", "values", "token_rewards"):
        assert batch[k].shape == (B, T - 1)
    for b, tr in enumerate(base_trajs):
        n = len(tr)
        assert torch.equal(batch["ids"][b, :n], tr.ids) and (batch["ids"][b, n:] == tok.pad_id).all()
        assert (batch["owner"][b, n:] == 0).all() and (batch["action_mask"][b, n - 1:] == 0).all()
    assert torch.equal(batch["rewards"], torch.tensor([t.reward for t in base_trajs]))


def test_no_logit_gradient_outside_the_action_mask(base_trajs, base_agent, tok):  # noqa: F811
    batch = collate(base_trajs, tok.pad_id)
    logits, _ = base_agent(batch["ids"])  # [B, T, V]
    logits.retain_grad()
    logp = F.log_softmax(logits[:, :-1], -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)  # [B, T-1]
    mask = batch["action_mask"]
    (-(mask * logp).sum()).backward()
    direct = logits.grad.abs().sum(-1)  # [B, T]
    assert (direct[:, :-1][mask == 1] > 0).all()
    assert (direct[:, :-1][mask == 0] == 0).all() and (direct[:, -1] == 0).all()


def test_same_seed_same_trajectories_and_different_seed_differs(tok):  # noqa: F811
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size)
    tasks = TRAIN[:3] * 2
    a, b, c = _sample(model, tok, tasks, seed=5), _sample(model, tok, tasks, seed=5), _sample(model, tok, tasks, seed=6)
    for x, y in zip(a, b):
        assert torch.equal(x.ids, y.ids) and torch.equal(x.sample_logp, y.sample_logp)
    assert any(not torch.equal(x.ids, z.ids) for x, z in zip(a, c))


def test_untrained_agent_makes_no_valid_call(tok):  # noqa: F811
    torch.manual_seed(0)
    trajs = _sample(TinyAgent(tok.vocab_size), tok, TRAIN[:4] * 2)
    stats = rollout_stats(trajs)
    assert stats["valid_calls"] == 0 and stats["turns"] == 6 and stats["pass_rate"] == 0
    assert set(rollout_stats(trajs)) == {"reward", "pass_rate", "valid_calls", "submit_rate", "turns",
                                          "action_tokens"}


def test_max_len_guard_ends_episodes_and_keeps_parity(tok):  # noqa: F811
    torch.manual_seed(0)
    model = TinyAgent(TinyAgentConfig(vocab_size=tok.vocab_size, max_len=96)).eval()
    trajs = _sample(model, tok, TRAIN[:4], seed=1)
    assert all(len(t) <= 96 for t in trajs)
    assert any(t.info["stop"] == "max_len" for t in trajs)
    batch = collate(trajs, tok.pad_id)
    with torch.no_grad():
        logp = sequence_log_probs(model, batch["ids"])
    assert ((logp - batch["sample_logp"]) * batch["action_mask"]).abs().max() < 1e-5


def test_temperature_changes_the_sampling_distribution(tok):  # noqa: F811
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    trajs = _sample(model, tok, TRAIN[:2], seed=0, temperature=0.5)
    batch = collate(trajs, tok.pad_id)
    with torch.no_grad():
        logits, _ = model(batch["ids"])
    ref = F.log_softmax(logits[:, :-1] / 0.5, -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)
    assert ((ref - batch["sample_logp"]) * batch["action_mask"]).abs().max() < 1e-5


def test_scripted_rollout_matches_episode_tokens(tok):  # noqa: F811
    env = bugfix_gym.BugFixEnv()
    for kind in ("random", "blind", "oracle"):
        tr = scripted_rollout(bugfix_gym.scripted_policy(kind, seed=0), env, "clamp", tok)
        ids, owner = bugfix_gym.episode_tokens(env.transcript, tok)
        assert np.array_equal(tr.ids.numpy(), ids) and np.array_equal(tr.owner.numpy(), owner)
        assert torch.equal(tr.action_mask, (tr.owner[1:] == 2).float())
        assert (tr.sample_logp == 0).all() and (tr.values == 0).all() and tr.task == "clamp"
        if kind == "oracle":
            assert tr.reward == 1.0
            (t,) = torch.nonzero(tr.token_rewards).flatten().tolist()
            assert tr.ids[t + 1] == tok.eoc_id and tok.decode(tr.ids[t:t + 2].tolist()) == "submit"
