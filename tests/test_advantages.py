"""Tests for agents.algorithms.advantages: reward-to-go, baselines, GAE across tool tokens, whitening."""
import math

import pytest
import torch

from agents.algorithms.advantages import (EMABaseline, batch_mean, explained_variance, gae_policy_tokens,
                                          optimal_constant_baseline, per_task_baseline, reward_to_go, whiten)

# One trajectory with 8 predicted positions (T-1 = 8), aligned as in docs/CONTRACT.md:
# position t predicts ids[t+1] and mask[t] = owner[t+1] == 2. Two calls with a tool output
# between them; the call cost and the outcome sit on each call's <eoc> position.
#   position: 0      1      2        3     4     5      6        7
#   target:   call1  call1  <eoc>    tool  tool  call2  <eoc>    pad
MASK = torch.tensor([[1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0]])
REWARDS = torch.tensor([[0.0, 0.0, -0.1, 0.0, 0.0, 0.0, 0.9, 0.0]])  # 0.1 call cost; +1 on submit
VALUES = torch.tensor([[0.4, 0.5, 0.6, 9.0, -4.0, 0.7, 0.8, 5.0]])  # 9, -4, 5 sit off the mask


def test_gae_hand_worked_across_tool_tokens():
    gamma, lam = 0.9, 0.8
    adv, ret = gae_policy_tokens(REWARDS, VALUES, MASK, gamma=gamma, lam=lam)
    # backwards over policy tokens; tool positions 3, 4 and pad 7 are skipped
    d6 = 0.9 + gamma * 0.0 - 0.8            # last policy token: nothing after it
    a6 = d6
    d5 = 0.0 + gamma * 0.8 - 0.7
    a5 = d5 + gamma * lam * a6
    d2 = -0.1 + gamma * 0.7 - 0.6           # bootstraps from position 5's value across the tool output
    a2 = d2 + gamma * lam * a5
    d1 = 0.0 + gamma * 0.6 - 0.5
    a1 = d1 + gamma * lam * a2
    d0 = 0.0 + gamma * 0.5 - 0.4
    a0 = d0 + gamma * lam * a1
    expected = torch.tensor([[a0, a1, a2, 0.0, 0.0, a5, a6, 0.0]])
    torch.testing.assert_close(adv, expected)
    assert a6 == pytest.approx(0.1) and a5 == pytest.approx(0.092) and a2 == pytest.approx(-0.00376)
    torch.testing.assert_close(ret, (expected + VALUES) * MASK)


def test_gae_ignores_values_at_masked_positions():
    adv, ret = gae_policy_tokens(REWARDS, VALUES, MASK, gamma=0.9, lam=0.8)
    other = VALUES.clone()
    other[MASK == 0] = torch.tensor([1e6, float("nan"), float("-inf")])
    adv2, ret2 = gae_policy_tokens(REWARDS, other, MASK, gamma=0.9, lam=0.8)
    torch.testing.assert_close(adv2, adv)
    torch.testing.assert_close(ret2, ret)
    # while changing a value on a policy token does change them
    moved = VALUES.clone()
    moved[0, 5] += 1.0
    assert not torch.allclose(gae_policy_tokens(REWARDS, moved, MASK, gamma=0.9, lam=0.8)[0], adv)


def test_gae_lambda_one_is_reward_to_go_minus_values_and_rows_are_independent():
    torch.manual_seed(0)
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0, 0], [1, 0, 0, 1, 1, 1, 1, 1]], dtype=torch.float)
    rewards = torch.randn(2, 8) * mask
    values = torch.randn(2, 8)
    for gamma in (1.0, 0.7):
        adv, ret = gae_policy_tokens(rewards, values, mask, gamma=gamma, lam=1.0)
        torch.testing.assert_close(adv, (reward_to_go(rewards, mask, gamma) - values) * mask)
        torch.testing.assert_close(ret, reward_to_go(rewards, mask, gamma))  # Monte-Carlo targets
    adv, _ = gae_policy_tokens(rewards, values, mask, gamma=0.9, lam=0.5)
    adv_row1, _ = gae_policy_tokens(rewards[1:], values[1:], mask[1:], gamma=0.9, lam=0.5)
    torch.testing.assert_close(adv[1:], adv_row1)
    # lam = 0 is the one-step TD error, next value taken across skipped positions
    adv0, _ = gae_policy_tokens(rewards, values, mask, gamma=0.9, lam=0.0)
    assert adv0[0, 2].item() == pytest.approx(rewards[0, 2].item() + 0.9 * values[0, 4].item() - values[0, 2].item())


def test_rewards_off_the_mask_are_rejected():
    bad = REWARDS.clone()
    bad[0, 3] = 1.0  # a reward on a tool token
    with pytest.raises(ValueError, match="zero off the policy mask"):
        gae_policy_tokens(bad, VALUES, MASK)
    with pytest.raises(ValueError, match="zero off the policy mask"):
        reward_to_go(bad, MASK)


def test_reward_to_go_by_hand():
    g = reward_to_go(REWARDS, MASK, gamma=1.0)
    # every token of the first call carries -0.1 + 0.9 = 0.8, the second call 0.9
    torch.testing.assert_close(g, torch.tensor([[0.8, 0.8, 0.8, 0.0, 0.0, 0.9, 0.9, 0.0]]))
    g = reward_to_go(REWARDS, MASK, gamma=0.5)
    # discount counts policy tokens only: from position 2, position 5 is one step away
    pos6, pos5 = 0.9, 0.5 * 0.9
    pos2 = -0.1 + 0.5 * pos5
    torch.testing.assert_close(g, torch.tensor([[0.25 * pos2, 0.5 * pos2, pos2, 0, 0, pos5, pos6, 0]]))


# ---------------------------------------------------------------- baselines

def test_baselines():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0])
    assert batch_mean(r).item() == 0.5
    ema = EMABaseline(init=0.2, decay=0.9)
    assert ema.value == 0.2
    assert ema.update(r) == pytest.approx(0.9 * 0.2 + 0.1 * 0.5)
    assert ema.update([0.0, 0.0]) == pytest.approx(0.9 * (0.9 * 0.2 + 0.05))
    b = per_task_baseline(["a", "b", "c"], ["a", "a", "b", "b", "b"], [1.0, 0.0, 1.0, 1.0, 1.0])
    assert b.tolist() == pytest.approx([0.5, 1.0, 0.8])  # 'c' unseen: the reference batch's mean
    # b* = E[R |g|^2] / E[|g|^2]
    sq = torch.tensor([1.0, 3.0, 2.0, 2.0])
    assert optimal_constant_baseline(r, sq) == pytest.approx((1 + 2) / 8)


def test_optimal_constant_baseline_minimises_the_variance():
    torch.manual_seed(0)
    g = torch.randn(500, 10) * torch.rand(500, 1) * 3  # per-episode scores
    rewards = (torch.rand(500) < 0.3).float()
    b_star = optimal_constant_baseline(rewards, g.pow(2).sum(-1))

    def total_var(b):
        return ((rewards - b)[:, None] * g).var(0).sum().item()

    for b in (0.0, rewards.mean().item(), 0.5, 1.0, b_star + 0.05, b_star - 0.05):
        assert total_var(b_star) <= total_var(b) + 1e-4


# ---------------------------------------------------------------- whitening / explained variance

def test_whiten_over_the_batch_policy_tokens():
    torch.manual_seed(0)
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.float)
    x = torch.randn(2, 4) * 3 + 2
    w = whiten(x, mask)
    on = mask > 0
    assert w[on].mean().item() == pytest.approx(0.0, abs=1e-6)
    assert w[on].std().item() == pytest.approx(1.0, abs=1e-4)  # unbiased std over all 5 tokens
    assert (w[~on] == 0).all()
    x2 = x.clone()
    x2[~on] = 1e4  # off-mask values do not enter the statistics
    torch.testing.assert_close(whiten(x2, mask), w)
    # statistics are over the whole batch, not per row: a row's mean is not zero
    assert abs(w[0, :2].mean().item()) > 1e-3
    ws = whiten(x, mask, shift_mean=False)
    assert ws[on].mean().item() == pytest.approx(x[on].mean().item(), abs=1e-5)
    assert ws[on].std().item() == pytest.approx(1.0, abs=1e-4)


def test_explained_variance():
    target = torch.tensor([[1.0, 2.0, 3.0, 99.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0]])
    assert explained_variance(target, target, mask) == pytest.approx(1.0)
    assert explained_variance(torch.full_like(target, 2.0), target, mask) == pytest.approx(0.0)
    assert explained_variance(torch.tensor([[3.0, 2.0, 1.0, 0.0]]), target, mask) == pytest.approx(-3.0)
    assert math.isnan(explained_variance(target, torch.ones_like(target), mask))
