"""The presets as their references publish them: KL in the reward (REINFORCE++'s per-token placement, TRL
RLOO's summed one) worked by hand and through TokenPPO's buffer, GiGPO's turn discount, token mean and its
two episode baselines worked by hand, and DAPO's overlong filtering."""
from __future__ import annotations

import torch

from agents.algorithms.advantages import AdvantageBatch, AdvantageConfig, get_adv_estimator_fn, kl_in_reward
from agents.algorithms.group_advantages import leave_one_out
from agents.algorithms.presets import get_preset
from tests.test_algorithms import REWARDS, _buffer, _episodes, _look

# two episodes of one group; position 1 of episode 0 is a tool token (not policy) whose KL must not count
MASK = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 0.0]])
TOKEN_REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])  # episode 0 passed, on its last policy token
REF_LOGP = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
OLD_LOGP = REF_LOGP + torch.tensor([[0.1, 5.0, 0.3], [-0.2, 0.0, 0.0]])  # k1 = old - ref: 0.1, (5: tool), 0.3 / -0.2, 0


def _batch() -> AdvantageBatch:
    return AdvantageBatch(TOKEN_REWARDS, torch.tensor([1.0, 0.0]), MASK, groups=torch.tensor([0, 0]))


def _advantages(name: str, batch: AdvantageBatch, **config) -> torch.Tensor:
    return get_adv_estimator_fn(name)(batch, AdvantageConfig(**config))[0]


def test_kl_in_the_reward_worked_by_hand_for_rloo_s_summed_placement():
    """beta 0.5: the k1 sums are 0.4 and -0.2, so the returns 1 and 0 become 0.8 and 0.1 and RLOO's
    G / (G - 1) (R - mean) is +-0.7, where the loss-term variant keeps the advantages of the raw returns, +-1."""
    penalised = kl_in_reward(_batch(), OLD_LOGP, REF_LOGP, 0.5, "k1")
    torch.testing.assert_close(penalised.rewards, torch.tensor([0.8, 0.1]))
    torch.testing.assert_close(penalised.token_rewards, torch.tensor([[-0.05, 0.0, 0.85], [0.1, 0.0, 0.0]]))
    torch.testing.assert_close(_advantages("rloo", penalised), torch.tensor([[0.7, 0.0, 0.7], [-0.7, -0.7, 0.0]]))
    torch.testing.assert_close(_advantages("rloo", _batch()), torch.tensor([[1.0, 0.0, 1.0], [-1.0, -1.0, 0.0]]))


def test_kl_in_the_reward_worked_by_hand_for_reinforce_pp_s_per_token_placement():
    """The token rewards -0.05, 0.85 / 0.1, 0 have the returns-to-go 0.8, 0.85 / 0.1, 0: mean 0.4375, Bessel
    variance 0.606875 / 3, so whitened 0.80596, 0.91714 / -0.75038, -0.97272; without the KL the returns-to-go
    1, 1 / 0, 0 whiten to +-0.86603: the two placements give different advantages."""
    penalised = kl_in_reward(_batch(), OLD_LOGP, REF_LOGP, 0.5, "k1")
    expected = torch.tensor([[0.80596, 0.0, 0.91714], [-0.75038, -0.97272, 0.0]])
    torch.testing.assert_close(_advantages("reinforce_pp", penalised), expected, atol=1e-4, rtol=0)
    plain = torch.tensor([[0.86603, 0.0, 0.86603], [-0.86603, -0.86603, 0.0]])
    torch.testing.assert_close(_advantages("reinforce_pp", _batch()), plain, atol=1e-4, rtol=0)


def test_kl_in_the_reward_is_off_at_zero_and_its_estimator_is_selectable():
    assert kl_in_reward(_batch(), OLD_LOGP, REF_LOGP, 0.0) is not None
    torch.testing.assert_close(kl_in_reward(_batch(), OLD_LOGP, REF_LOGP, 0.0).rewards, torch.tensor([1.0, 0.0]))
    k2 = kl_in_reward(_batch(), OLD_LOGP, REF_LOGP, 1.0, "k2")  # 0.5 (log r)^2: 0.005 + 0.045 / 0.02 + 0
    torch.testing.assert_close(k2.rewards, torch.tensor([1.0 - 0.05, -0.02]))


def test_rloo_and_reinforce_pp_put_k1_in_the_reward_and_token_ppo_s_buffer_applies_it():
    assert get_preset("rloo").settings["kl_reward_coef"] == 0.05
    assert get_preset("reinforce_pp").settings["kl_reward_coef"] == 0.01
    assert {get_preset(n).settings["kl_reward_estimator"] for n in ("rloo", "reinforce_pp")} == {"k1"}
    assert "kl_coef" not in get_preset("rloo").settings and "kl_coef" not in get_preset("reinforce_pp").settings
    model = _look("rloo")
    assert model.ref_model is not None and model.rollout_buffer.kl_reward_coef == 0.05
    with torch.no_grad():  # move the policy off its reference, so the KL is not 0
        for p in model.policy.model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    trajs = _episodes(model)
    buffer = _buffer(model, trajs, kl_reward_coef=0.0)  # the estimator alone, then with the KL, on one batch
    model._freeze_old_policy(buffer)
    buffer.kl_reward_coef = 0.05
    buffer.compute_returns_and_advantage()
    kl_sums = ((buffer.old_logp - buffer.ref_logp) * buffer.policy_mask).sum(1)
    assert float(kl_sums.abs().max()) > 1e-3
    expected = leave_one_out(torch.tensor(REWARDS) - 0.05 * kl_sums, buffer.groups)
    torch.testing.assert_close(buffer.raw_advantages, expected[:, None] * buffer.policy_mask)
    plain = leave_one_out(torch.tensor(REWARDS), buffer.groups)[:, None] * buffer.policy_mask
    assert not torch.allclose(buffer.raw_advantages, plain)


# ---------------------------------------------------------------- GiGPO
# one group of two episodes: episode 0 has two turns (tokens 0 and 2, a tool token between), reward 1 at its end;
# episode 1 one turn, reward 0. Both first turns start from one state (key 0); episode 0's second from key 1.
GIGPO_MASK = torch.tensor([[1.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
GIGPO_REWARDS = torch.tensor([[0.0, 0.0, 1.0], [0.0, 0.0, 0.0]])
KEYS = torch.tensor([[0, 1], [0, -1]])


def _gigpo(**config) -> torch.Tensor:
    batch = AdvantageBatch(GIGPO_REWARDS, torch.tensor([1.0, 0.0]), GIGPO_MASK, groups=torch.tensor([0, 0]),
                           state_keys=KEYS)
    return _advantages("gigpo", batch, std_eps=0.0, **config)


def test_gigpo_s_turn_discount_worked_by_hand():
    """Episode level: returns 1, 0 -> +-0.70711 (Bessel std 0.70711). Step level at key 0: the first turns'
    returns 0.95 (discounted one turn) and 0 -> +-0.70711; key 1 is seen once -> 0. So episode 0's first call gets
    1.41421, its second 0.70711; episode 1's call -1.41421. With gamma 1 the step returns are 1 and 0 and the
    step advantages are the same +-0.70711: the discount moves only the step returns' scale, which the std takes out."""
    a = 0.70711
    expected = torch.tensor([[2 * a, 0.0, a], [-2 * a, 0.0, 0.0]])
    torch.testing.assert_close(_gigpo(turn_gamma=0.95), expected, atol=1e-4, rtol=0)
    torch.testing.assert_close(_gigpo(turn_gamma=1.0), expected, atol=1e-4, rtol=0)
    unscaled = _gigpo(turn_gamma=0.95, scale_rewards="none")  # no std: the step term is G - mean, 0.95 / 2
    torch.testing.assert_close(unscaled, torch.tensor([[0.5 + 0.475, 0.0, 0.5], [-0.5 - 0.475, 0.0, 0.0]]))


def test_gigpo_s_two_episode_baselines_worked_by_hand():
    """``step_rows`` counts episode 0 (two turns) twice: rows 1, 1, 0 have mean 2/3 and Bessel std 0.57735, so
    A^E is 0.57735 for episode 0 and -1.15470 for episode 1, where ``episode`` gives +-0.70711."""
    rows = _gigpo(episode_baseline="step_rows", step_advantage_weight=0.0, scale_rewards="group")
    torch.testing.assert_close(rows, torch.tensor([[0.57735, 0.0, 0.57735], [-1.15470, 0.0, 0.0]]),
                               atol=1e-4, rtol=0)
    once = _gigpo(episode_baseline="episode", step_advantage_weight=0.0)
    torch.testing.assert_close(once, torch.tensor([[0.70711, 0.0, 0.70711], [-0.70711, 0.0, 0.0]]),
                               atol=1e-4, rtol=0)


def test_the_gigpo_preset_is_verl_agent_s():
    settings = get_preset("gigpo").settings
    published = (0.95, "token_mean", "episode")
    assert (settings["turn_gamma"], settings["loss_mode"], settings["episode_baseline"]) == published
    model = _look("gigpo", episode_baseline="step_rows")
    assert model.rollout_buffer.advantage_config.episode_baseline == "step_rows"
    assert model.rollout_buffer.advantage_config.turn_gamma == 0.95


# ---------------------------------------------------------------- DAPO

def test_dapo_filters_overlong_episodes_out_of_the_loss():
    assert get_preset("dapo").settings["mask_truncated_completions"] is True
    model = _look("dapo")
    trajs = _episodes(model)
    for i, traj in enumerate(trajs):  # the first ran out of turns, the others ended
        traj.info = dict(traj.info, **{"TimeLimit.truncated": i == 0})
    buffer = _buffer(model, trajs)
    assert float(buffer.loss_mask()[0].sum()) == 0.0 and float(buffer.policy_mask[0].sum()) > 0
    assert torch.equal(buffer.loss_mask()[1:], buffer.policy_mask[1:])
