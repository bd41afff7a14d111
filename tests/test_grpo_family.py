"""Known answers for the critic-free GRPO family: group advantages, normalisers, GSPO, CISPO,
REINFORCE++, ReBN and GiGPO, each worked by hand or read off with autograd; and a short training
run through the registries with every new estimator and loss."""
from __future__ import annotations

import math

import gymnasium as gym
import pytest
import torch

import bugfix_gym
from agents.algorithms.advantages import AdvantageBatch, AdvantageConfig, get_adv_estimator_fn, whiten
from agents.algorithms.callbacks import StopAfterIterations
from agents.algorithms.group_advantages import (anchor_state_keys, discounted_turn_returns, group_normalised,
                                                leave_one_out, step_group_advantage, turn_index, turn_rewards)
from agents.algorithms.losses import (PolicyLossConfig, aggregate_loss, get_policy_loss_fn, kl_estimate,
                                      masked_mean)
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.reinforce import Reinforce

# ten episodes in four groups: G=4 mixed, G=2 all equal, G=1, G=3 mixed
REWARDS = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 2.0, 0.0, 1.0])
GROUPS = torch.tensor([0, 0, 0, 0, 1, 1, 2, 3, 3, 3])
GROUP_ESTIMATORS = ("grpo", "dr_grpo", "rloo")
NEW_ESTIMATORS = ("grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "rebn", "gigpo")


# ---------------------------------------------------------------- group advantages by hand

def test_grpo_group_advantages_worked_by_hand():
    """Group 0: mean 1/2, Bessel std sqrt(1/3), so +-(1/2)/sqrt(1/3) = +-0.8660; group 3: mean 1, std 1,
    so (1, -1, 0); an all-equal group and a group of one get exactly 0 (std 0: 0 / eps)."""
    adv = group_normalised(REWARDS, GROUPS, "group", eps=1e-6)
    a = 0.5 / math.sqrt(1 / 3)
    expected = torch.tensor([a, -a, -a, a, 0, 0, 0, 1, -1, 0])
    torch.testing.assert_close(adv, expected, atol=1e-5, rtol=0)
    assert (adv[4:7] == 0).all() and torch.isfinite(adv).all()
    none = group_normalised(REWARDS, GROUPS, "none")
    assert none.tolist() == [0.5, -0.5, -0.5, 0.5, 0, 0, 0, 1, -1, 0]
    batch_std = float(REWARDS.std())  # std of every reward of the batch, the mean still the group's
    torch.testing.assert_close(group_normalised(REWARDS, GROUPS, "batch", eps=0.0), none / batch_std)
    one = group_normalised(torch.tensor([3.0]), torch.tensor([0]), "batch")
    assert one.tolist() == [0.0]  # a batch of one: std 0, advantage 0


def test_rloo_by_hand_and_its_identity_with_mean_centred_advantages():
    """r_i minus the mean of the other G-1: group 0 gives 1 - 1/3 = 2/3 and 0 - 2/3; group 3 gives
    2 - 1/2, 0 - 3/2, 1 - 1; the all-equal group 0; the group of one 0. And RLOO = centred x G/(G-1)."""
    adv = leave_one_out(REWARDS, GROUPS)
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 0, 0, 0, 1.5, -1.5, 0])
    torch.testing.assert_close(adv, expected)
    torch.manual_seed(0)
    rewards, groups = torch.randn(12), torch.tensor([0] * 5 + [1] * 4 + [2] * 3)
    sizes = torch.tensor([5.0] * 5 + [4.0] * 4 + [3.0] * 3)
    centred = group_normalised(rewards, groups, "none")
    torch.testing.assert_close(leave_one_out(rewards, groups), centred * sizes / (sizes - 1))
    others = torch.stack([(rewards[groups == groups[i]].sum() - rewards[i]) / (sizes[i] - 1) for i in range(12)])
    torch.testing.assert_close(leave_one_out(rewards, groups), rewards - others)


@pytest.mark.parametrize("name", GROUP_ESTIMATORS)
def test_group_advantages_sum_to_zero_per_group_on_every_policy_token(name):
    torch.manual_seed(1)
    rewards, groups = torch.rand(9).round(), torch.tensor([2, 2, 2, 7, 7, 7, 7, 9, 9])  # any labels
    mask = (torch.rand(9, 6) > 0.3).float()
    mask[:, 0] = 1.0
    adv, returns = get_adv_estimator_fn(name)(AdvantageBatch(torch.zeros(9, 6), rewards, mask, groups=groups),
                                              AdvantageConfig())
    assert returns is None and adv.shape == (9, 6)
    assert (adv[mask == 0] == 0).all()
    per_episode = adv[:, 0]
    assert torch.equal(adv, per_episode[:, None] * mask)  # the same advantage on every token of an episode
    for g in groups.unique():
        assert abs(float(per_episode[groups == g].sum())) < 1e-5


def test_a_batch_without_groups_is_one_group():
    """Until the sampler carries groups, ``groups=None`` makes the whole batch one group."""
    mask = torch.ones(4, 3)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    adv, _ = get_adv_estimator_fn("dr_grpo")(AdvantageBatch(torch.zeros(4, 3), rewards, mask), AdvantageConfig())
    assert adv[:, 0].tolist() == [0.5, -0.5, -0.5, 0.5]
    with pytest.raises(ValueError, match=r"groups must hold one label per episode \(4,\), got \(3,\)"):
        get_adv_estimator_fn("grpo")(AdvantageBatch(torch.zeros(4, 3), rewards, mask, groups=torch.zeros(3)),
                                     AdvantageConfig())
    with pytest.raises(ValueError, match="scale_rewards must be one of group, batch, none, got 'std'"):
        get_adv_estimator_fn("grpo")(AdvantageBatch(torch.zeros(4, 3), rewards, mask),
                                     AdvantageConfig(scale_rewards="std"))


# ---------------------------------------------------------------- normalisers

def test_each_normaliser_weighs_tokens_as_trl_writes_it():
    """GRPO: per-sequence means (1 / (B L_n)); DAPO / BNPO: the token count (1 / sum L); Dr. GRPO:
    1 / (B L_max) with L_max a constant; read off with autograd and checked against TRL's formulas."""
    lengths = torch.tensor([4, 8, 24])
    mask = (torch.arange(24)[None] < lengths[:, None]).float()  # [3, 24]
    torch.manual_seed(0)
    per_token = torch.randn(3, 24, requires_grad=True)
    l_max = 32
    trl = {  # TRL's GRPOTrainer._compute_loss, one process, no gradient accumulation
        "seq_mean_token_mean": ((per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).mean(),  # grpo
        "token_mean": (per_token * mask).sum() / mask.sum(),  # dapo, bnpo
        "seq_mean_token_sum_norm": (per_token * mask).sum() / (per_token.size(0) * l_max),  # dr_grpo
    }
    weights = {"seq_mean_token_mean": 1.0 / (3 * lengths.float()), "token_mean": torch.full((3,), 1.0 / 36),
               "seq_mean_token_sum_norm": torch.full((3,), 1.0 / (3 * l_max))}
    for mode, reference in trl.items():
        loss = aggregate_loss(per_token, mask, mode, norm_const=l_max)
        torch.testing.assert_close(loss, reference)
        weight = torch.autograd.grad(loss, per_token)[0]  # [3, 24]
        torch.testing.assert_close(weight, weights[mode][:, None] * mask)
    with pytest.raises(ValueError, match="needs norm_const = L_max"):
        aggregate_loss(per_token, mask, "seq_mean_token_sum_norm")


def test_k3_kl_in_the_loss_is_trls_and_adds_per_token():
    """GRPO's beta * KL term: kl_estimate('k3') is TRL's per_token_kl, and a linear aggregation of the
    policy loss plus beta times the aggregated KL (TokenPPO's kl_coef) equals TRL's per-token sum."""
    torch.manual_seed(2)
    logp, ref = -torch.rand(3, 5), -torch.rand(3, 5)
    trl = torch.exp(ref - logp) - (ref - logp) - 1
    torch.testing.assert_close(kl_estimate(logp, ref, "k3"), trl)
    mask, pg, beta = (torch.rand(3, 5) > 0.2).float(), torch.randn(3, 5), 0.04
    for mode in ("seq_mean_token_mean", "token_mean"):
        torch.testing.assert_close(aggregate_loss(pg, mask, mode) + beta * aggregate_loss(trl, mask, mode),
                                   aggregate_loss(pg + beta * trl, mask, mode))


# ---------------------------------------------------------------- GSPO and CISPO

def _off_policy_batch():
    torch.manual_seed(3)
    old_logp = -torch.rand(3, 6) - 0.1
    logp = (old_logp + 0.3 * torch.randn(3, 6)).requires_grad_(True)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 1, 0]], dtype=torch.float)
    return logp, old_logp, mask


def test_gspo_ratio_is_the_exp_of_the_mean_log_ratio_and_its_gradient_the_sequence_objectives():
    logp, old_logp, mask = _off_policy_batch()
    adv = torch.tensor([1.0, -0.5, 2.0])
    wide = PolicyLossConfig(clip_low=0.99, clip_high=100.0, mode="seq_mean_token_mean")  # nothing clipped
    loss, stats = get_policy_loss_fn("gspo")(logp, old_logp, adv, mask, wide)
    s = torch.exp(masked_mean(logp - old_logp, mask, dim=-1))  # [3] exp(mean_t log w), with grad
    reference = -(s * adv).mean()  # the pure sequence-level objective, one term per episode
    torch.testing.assert_close(loss, reference)
    grad, ref_grad = torch.autograd.grad(loss, logp)[0], torch.autograd.grad(reference, logp)[0]
    torch.testing.assert_close(grad, ref_grad)
    assert stats["clip_frac"] == 0.0
    # a tight clip: a sequence whose ratio leaves [1 - 0.01, 1 + 0.01] loses the gradient of every token
    tight = PolicyLossConfig(clip_low=0.01, clip_high=0.01, mode="seq_mean_token_mean")
    loss, stats = get_policy_loss_fn("gspo")(logp, old_logp, adv, mask, tight)
    grad = torch.autograd.grad(loss, logp)[0]
    out = ((s > 1.01) & (adv > 0)) | ((s < 0.99) & (adv < 0))  # [3] clipped sequences
    assert out.any()
    for n in range(3):
        assert bool((grad[n][mask[n] > 0] == 0).all()) == bool(out[n])
    assert stats["clip_frac"] == pytest.approx(float((out[:, None] * mask).sum() / mask.sum()))


@pytest.mark.parametrize("mode", ["token_mean", "seq_mean_token_mean"])
def test_gspo_equals_the_token_ratio_at_the_first_step(mode):
    """logp == old_logp: every sequence ratio is 1, and loss and gradient are ppo_clip's (on-policy)."""
    logp, _, mask = _off_policy_batch()
    old_logp = logp.detach().clone()
    adv = torch.tensor([[1.0] * 6, [-2.0] * 6, [0.5] * 6])
    config = PolicyLossConfig(clip_low=3e-4, clip_high=4e-4, mode=mode)
    gspo, _ = get_policy_loss_fn("gspo")(logp, old_logp, adv, mask, config)
    ppo, _ = get_policy_loss_fn("ppo_clip")(logp, old_logp, adv, mask, config)
    assert gspo.item() == ppo.item()
    assert torch.equal(torch.autograd.grad(gspo, logp)[0], torch.autograd.grad(ppo, logp)[0])


def test_cispo_keeps_the_gradient_of_tokens_ppo_clips():
    """Token 0: w = 2 with A = 1 under clip 0.2, so ppo_clip's gradient there is 0; CISPO's is
    -min(w, cap) * A / (tokens) = -1.5 / 4 with the absolute cap 1.5 (token_mean over 4 tokens)."""
    old_logp = torch.log(torch.tensor([[0.25, 0.5, 0.5, 0.5]]))
    logp = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5]])).requires_grad_(True)  # w = (2, 1, 1, 1)
    mask, adv = torch.ones(1, 4), torch.ones(1)
    config = PolicyLossConfig(clip_low=0.2, clip_high=0.2, max_is_weight=1.5)
    ppo, _ = get_policy_loss_fn("ppo_clip")(logp, old_logp, adv, mask, config)
    assert torch.autograd.grad(ppo, logp)[0][0, 0] == 0
    cispo, stats = get_policy_loss_fn("cispo")(logp, old_logp, adv, mask, config)
    grad = torch.autograd.grad(cispo, logp)[0]
    torch.testing.assert_close(grad, torch.tensor([[-1.5 / 4, -1 / 4, -1 / 4, -1 / 4]]))
    assert stats["clip_frac"] == 0.25 and stats["dual_clip_frac"] == 0.0
    torch.testing.assert_close(cispo, -(1.5 * logp[0, 0] + logp[0, 1:].sum()) / 4)
    with pytest.raises(ValueError, match="max_is_weight must be positive"):
        get_policy_loss_fn("cispo")(logp, old_logp, adv, mask, PolicyLossConfig(max_is_weight=0.0))


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "cispo"])
def test_the_first_ratio_is_exactly_one_for_every_ratio_loss(name):
    logp, _, mask = _off_policy_batch()
    adv = torch.tensor([1.0, -1.0, 0.5])
    loss, stats = get_policy_loss_fn(name)(logp, logp.detach().clone(), adv, mask, PolicyLossConfig(dual_clip=3.0))
    assert stats["ratio_min"] == 1.0 and stats["ratio_max"] == 1.0
    assert stats["clip_frac"] == 0.0 and stats["dual_clip_frac"] == 0.0 and stats["approx_kl"] == 0.0
    reinforce, _ = get_policy_loss_fn("reinforce")(logp, logp.detach(), adv, mask, PolicyLossConfig())
    torch.testing.assert_close(torch.autograd.grad(loss, logp)[0], torch.autograd.grad(reinforce, logp)[0])


# ---------------------------------------------------------------- REINFORCE++ and turns

def _multi_turn_batch():
    """Two episodes: row 0 has turns of 2, 1, 2 tokens (rewards -0.1, -0.1, 1 on their last token),
    row 1 has turns of 1 and 3 tokens (rewards -0.1, 0); tool tokens (0 in the mask) between turns."""
    mask = torch.tensor([[1, 1, 0, 1, 0, 0, 1, 1], [0, 1, 0, 1, 1, 1, 0, 0]], dtype=torch.float)
    rewards = torch.zeros(2, 8)
    rewards[0, 1], rewards[0, 3], rewards[0, 7] = -0.1, -0.1, 1.0
    rewards[1, 1] = -0.1
    return rewards, mask


def test_turns_and_their_discounted_returns_by_hand():
    rewards, mask = _multi_turn_batch()
    assert turn_index(mask).tolist() == [[0, 0, -1, 1, -1, -1, 2, 2], [-1, 0, -1, 1, 1, 1, -1, -1]]
    per_turn, turn_mask = turn_rewards(rewards, mask)
    torch.testing.assert_close(per_turn, torch.tensor([[-0.1, -0.1, 1.0], [-0.1, 0.0, 0.0]]))
    assert turn_mask.tolist() == [[1, 1, 1], [1, 1, 0]]
    returns = discounted_turn_returns(per_turn, turn_mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[-0.1 - 0.05 + 0.25, -0.1 + 0.5, 1.0], [-0.1, 0.0, 0.0]]))


@pytest.mark.parametrize("name", ["reinforce_pp", "reinforce_pp_baseline"])
def test_reinforce_pp_whitens_over_policy_tokens(name):
    rewards, mask = _multi_turn_batch()
    batch = AdvantageBatch(rewards, rewards.sum(1), mask)  # one group: R - mean_G = (0.45, -0.45)
    adv, _ = get_adv_estimator_fn(name)(batch, AdvantageConfig())
    on = adv[mask > 0]
    assert abs(float(on.mean())) < 1e-6 and float(on.std()) == pytest.approx(1.0, abs=1e-6)
    assert (adv[mask == 0] == 0).all()
    if name == "reinforce_pp":  # per-token returns (reward-to-go): row 0 gives 0.8, 0.8, 0.9, 1, 1
        from agents.algorithms.advantages import reward_to_go
        torch.testing.assert_close(adv, whiten(reward_to_go(rewards, mask), mask))
    else:
        centred = torch.tensor([0.45, -0.45])[:, None] * mask
        torch.testing.assert_close(adv, whiten(centred, mask))
        alone = AdvantageBatch(rewards, rewards.sum(1), mask, groups=torch.tensor([0, 1]))
        adv, _ = get_adv_estimator_fn(name)(alone, AdvantageConfig())
        assert (adv == 0).all()  # groups of one: R - mean_G = 0 everywhere, and whitening keeps 0 finite


def test_rebn_normalises_per_turn_returns_over_the_batch():
    """Turn returns (gamma 1): row 0 (0.8, 0.9, 1.0), row 1 (-0.1, 0.0); normalised over these five."""
    rewards, mask = _multi_turn_batch()
    adv, returns = get_adv_estimator_fn("rebn")(AdvantageBatch(rewards, rewards.sum(1), mask), AdvantageConfig())
    g = torch.tensor([0.8, 0.9, 1.0, -0.1, 0.0])
    a = (g - g.mean()) / (g.std() + 1e-6)
    expected = torch.tensor([[a[0], a[0], 0, a[1], 0, 0, a[2], a[2]], [0, a[3], 0, a[4], a[4], a[4], 0, 0]])
    assert returns is None
    torch.testing.assert_close(adv, expected)


# ---------------------------------------------------------------- GiGPO's anchor states

def _gigpo_batch():
    """Prompt (5, 6); a call is 2 tokens then a tool reply of 1 token. Rows 0-2 are one group,
    row 3 another with the same prompt. Rows 0 and 1 make the same first call and get the same reply;
    row 2's first call differs in one token; row 3 repeats row 0 exactly."""
    ids = torch.tensor([
        [5, 6, 10, 11, 20, 12, 13, 20],
        [5, 6, 10, 11, 20, 12, 14, 20],
        [5, 6, 10, 12, 20, 12, 13, 20],
        [5, 6, 10, 11, 20, 12, 13, 20],
    ])
    mask = torch.tensor([[0, 1, 1, 0, 1, 1, 0]] * 4, dtype=torch.float)  # targets ids[:, 1:]
    token_rewards = torch.zeros(4, 7)
    token_rewards[:, 5] = torch.tensor([1.0, 0.0, 0.0, 1.0])  # success on the second call's last token
    return ids, mask, token_rewards, torch.tensor([0, 0, 0, 1])


def test_anchor_state_keys_are_equal_only_for_token_identical_prefixes():
    ids, mask, _, _ = _gigpo_batch()
    keys = anchor_state_keys(ids, mask)
    assert keys.shape == (4, 2)
    assert len(set(keys[:, 0].tolist())) == 1  # one prompt: one state before the first call
    assert keys[0, 1] == keys[1, 1] == keys[3, 1] and keys[2, 1] != keys[0, 1]
    torch.manual_seed(5)  # random episodes over a tiny vocabulary: keys equal iff prefixes equal
    ids = torch.randint(0, 2, (24, 9))
    mask = (torch.rand(24, 8) > 0.4).float()
    keys = anchor_state_keys(ids, mask)
    index = turn_index(mask)
    prefixes = {}
    for b in range(24):
        for p in range(8):
            if index[b, p] >= 0 and (p == 0 or index[b, p - 1] != index[b, p]):
                prefixes[(b, int(index[b, p]))] = tuple(ids[b, :p + 1].tolist())
    assert len(prefixes) == int((keys >= 0).sum())
    for i, pi in prefixes.items():
        for j, pj in prefixes.items():
            assert (keys[i] == keys[j]) == (pi == pj)


def test_gigpo_step_groups_hold_only_equal_states_of_one_group():
    """Turn 0: rows 0-2 share the state (returns 1, 0, 0: mean 1/3, std sqrt(1/3)); row 3 is alone in its
    group. Turn 1: rows 0 and 1 share it (returns 1, 0: +-1/sqrt(1/2)); row 2 and row 3 are alone.
    A = A^E + A^S, A^E being GRPO's (1, -1/2, -1/2 over sqrt(1/3), and 0 for row 3)."""
    ids, mask, token_rewards, groups = _gigpo_batch()
    keys = anchor_state_keys(ids, mask)
    per_turn, turn_mask = turn_rewards(token_rewards, mask)
    returns = discounted_turn_returns(per_turn, turn_mask)
    step = step_group_advantage(returns, turn_mask, groups, keys, eps=0.0)
    s0, s1 = (2 / 3) / math.sqrt(1 / 3), 0.5 / math.sqrt(0.5)
    torch.testing.assert_close(step, torch.tensor([[s0, s1], [-s0 / 2, -s1], [-s0 / 2, 0.0], [0.0, 0.0]]))
    batch = AdvantageBatch(token_rewards, token_rewards.sum(1), mask, groups=groups, state_keys=keys)
    config = AdvantageConfig(std_eps=0.0, step_advantage_weight=0.5)
    adv, _ = get_adv_estimator_fn("gigpo")(batch, config)
    episode = torch.tensor([s0, -s0 / 2, -s0 / 2, 0.0])  # group 0's returns are its turn-0 returns here
    expected = episode[:, None] * mask
    for b in range(4):  # turn 0 is on positions 1-2, turn 1 on 4-5
        expected[b, 1:3] += 0.5 * step[b, 0]
        expected[b, 4:6] += 0.5 * step[b, 1]
    torch.testing.assert_close(adv, expected)
    without, _ = get_adv_estimator_fn("gigpo")(AdvantageBatch(token_rewards, token_rewards.sum(1), mask,
                                                              groups=groups), config)
    torch.testing.assert_close(without, episode[:, None] * mask)  # no keys: no equal states, A = A^E
    with pytest.raises(ValueError, match="anchor_state_keys"):
        get_adv_estimator_fn("gigpo")(AdvantageBatch(token_rewards, token_rewards.sum(1), mask, groups=groups,
                                                     state_keys=keys[:, :1]), config)


# ---------------------------------------------------------------- through the registries

def _look_agent(algo: type, **kwargs):
    look = gym.make("LookThenAnswer-v0")
    tok = bugfix_gym.Tokenizer(look.unwrapped.words)
    config = dict(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=64)
    return algo("TinyAgentPolicy", look, base_agent=None, seed=0, n_episodes=16,
                policy_kwargs=dict(tokenizer=tok, model_config=config), **kwargs)


@pytest.mark.parametrize("settings", [dict(adv_estimator=name) for name in NEW_ESTIMATORS] + [
    dict(adv_estimator="grpo", policy_loss="gspo", clip_range=3e-4, clip_range_high=4e-4),
    dict(adv_estimator="grpo", policy_loss="cispo"),
    dict(adv_estimator="dr_grpo", loss_mode="seq_mean_token_sum_norm", loss_norm_const=16.0),
])
@pytest.mark.heavy
def test_token_ppo_trains_with_every_new_estimator_and_loss(settings):
    """A batch without groups is one group (the sampler does not carry groups yet)."""
    model = _look_agent(TokenPPO, n_epochs=2, **settings)
    model.learn(10**6, callback=StopAfterIterations(2))
    epochs = [e for entry in model.diagnostics for e in entry["epochs"]]
    assert epochs and all(math.isfinite(e["loss"]) and math.isfinite(e["pg_loss"]) for e in epochs)
    assert epochs[0]["ratio_min"] <= 1.0 <= epochs[0]["ratio_max"]


@pytest.mark.parametrize("name", NEW_ESTIMATORS)
def test_reinforce_trains_with_every_new_estimator(name):
    model = _look_agent(Reinforce, adv_estimator=name)
    model.learn(10**6, callback=StopAfterIterations(2))
    assert len(model.diagnostics) == 2 and all(math.isfinite(d["loss"]) for d in model.diagnostics)
