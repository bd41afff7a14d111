"""agents.algorithms.losses: aggregation weights, REINFORCE surrogate, PPO clipping, value loss, KL estimators."""
import math

import pytest
import torch

from agents.algorithms.losses import (AGGREGATION_MODES, aggregate_loss, clipped_policy_loss, clipped_value_loss,
                                      kl_estimate, masked_mean, reinforce_loss, tool_output_mask)


# ---------------------------------------------------------------- masked_mean / aggregate_loss

def test_masked_mean_ignores_masked_entries_and_empty_rows():
    x = torch.tensor([[1.0, 2.0, 100.0], [5.0, -50.0, -50.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert masked_mean(x, mask).item() == pytest.approx(1.5)
    per_row = masked_mean(x, mask, dim=-1)
    assert per_row.tolist() == pytest.approx([1.5, 0.0])  # an empty row gives 0, not NaN


def _book_batch():
    """The book's §6.6 example: three trajectories with 4, 8 and 24 policy tokens."""
    lengths = torch.tensor([4, 8, 24])
    mask = (torch.arange(24)[None] < lengths[:, None]).float()  # [3, 24]
    return lengths, mask


@pytest.mark.parametrize("mode", AGGREGATION_MODES)
def test_aggregation_weights_read_off_with_autograd_match_spec_table(mode):
    lengths, mask = _book_batch()
    B, C = 3, 3 * 24
    per_token = torch.zeros(3, 24, requires_grad=True)
    loss = aggregate_loss(per_token, mask, mode, norm_const=C)
    weight = torch.autograd.grad(loss, per_token)[0]  # dL / d(per-token term) [3, 24]
    L = lengths.float()
    expected_row = {  # the book's §6.6 table: weight of one policy token of row n
        "token_mean": torch.full((3,), 1.0 / L.sum().item()),
        "seq_mean_token_sum": torch.full((3,), 1.0 / B),
        "seq_mean_token_mean": 1.0 / (B * L),
        "constant": torch.full((3,), 1.0 / C),
    }[mode]
    expected = expected_row[:, None] * mask
    torch.testing.assert_close(weight, expected)
    assert (weight[mask == 0] == 0).all()  # padding gets no weight
    # and the book's printed numbers (4 decimals)
    book = {"token_mean": [0.0278] * 3, "seq_mean_token_sum": [0.3333] * 3,
            "seq_mean_token_mean": [0.0833, 0.0417, 0.0139], "constant": [0.0139] * 3}[mode]
    assert [round(w, 4) for w in weight[:, 0].tolist()] == book


def test_aggregation_errors_say_what_to_do():
    _, mask = _book_batch()
    x = torch.zeros(3, 24)
    with pytest.raises(ValueError, match=r"mode='constant' needs norm_const, e.g. batch_size \* max_policy_tokens"):
        aggregate_loss(x, mask, "constant")
    with pytest.raises(ValueError) as err:
        aggregate_loss(x, mask, "token_sum")
    for mode in AGGREGATION_MODES:
        assert mode in str(err.value)
    assert "token_sum" in str(err.value)


# ---------------------------------------------------------------- reinforce_loss

def test_reinforce_loss_trajectory_and_token_advantages_agree_and_are_detached():
    torch.manual_seed(0)
    logp = torch.randn(3, 5, requires_grad=True)
    mask = torch.tensor([[1, 1, 0, 0, 0], [0, 1, 1, 1, 0], [1, 0, 0, 0, 0]], dtype=torch.float)
    adv = torch.tensor([0.5, -1.0, 2.0], requires_grad=True)
    loss_b = reinforce_loss(logp, adv, mask, "seq_mean_token_sum")
    loss_bt = reinforce_loss(logp, adv[:, None].expand(3, 5), mask, "seq_mean_token_sum")
    torch.testing.assert_close(loss_b, loss_bt)
    grad_logp, = torch.autograd.grad(loss_b, logp, retain_graph=True)
    torch.testing.assert_close(grad_logp, -adv.detach()[:, None] * mask / 3)
    assert torch.autograd.grad(loss_b, adv, allow_unused=True)[0] is None  # no path to adv
    torch.testing.assert_close(reinforce_loss(logp, adv[:, None], mask, "seq_mean_token_sum"), loss_b)
    with pytest.raises(ValueError, match="advantages must be"):
        reinforce_loss(logp, torch.zeros(3, 4), mask)
    with pytest.raises(ValueError, match="advantages must be"):
        reinforce_loss(logp, torch.zeros(2), mask)


def test_detached_baseline_is_unbiased_attached_is_not_book_6_8_bandit():
    """Book §6.8: a 5-action bandit, baseline = the policy's own prob of action 0.

    Leaving the baseline attached adds -grad(b) * mean(log pi) to the estimate (expectation
    H(pi) grad b): relative error ~1.5 in the book. reinforce_loss detaches it, so passing
    the *attached* advantage through it gives the unbiased estimate (~0.001 in the book).
    """
    logits = torch.tensor([0.5, -0.2, 0.1, 0.0, 0.3], requires_grad=True)
    reward_of = torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0])
    probs = torch.softmax(logits, -1)
    exact = torch.autograd.grad((probs * reward_of).sum(), logits, retain_graph=True)[0]
    n = 200_000
    actions = torch.multinomial(probs.detach(), n, replacement=True, generator=torch.Generator().manual_seed(0))
    logp = torch.log_softmax(logits, -1)[actions][:, None]  # [N, 1]
    mask = torch.ones(n, 1)
    adv_attached = reward_of[actions] - probs[0]  # depends on theta

    def rel_err(loss):
        estimate = -torch.autograd.grad(loss, logits, retain_graph=True)[0]
        return ((estimate - exact).norm() / exact.norm()).item()

    err_reinforce = rel_err(reinforce_loss(logp, adv_attached, mask, "token_mean"))
    err_naive = rel_err(-(adv_attached[:, None] * logp).mean())  # the bug: no detach
    assert err_reinforce < 0.02
    assert err_naive > 0.5


# ---------------------------------------------------------------- clipped_policy_loss

def _one_row(ratios, adv):
    ratios = torch.tensor(ratios, dtype=torch.float64)
    logp = torch.log(ratios).clone().requires_grad_()
    old = torch.zeros_like(ratios)
    adv = torch.full((1, len(ratios)), float(adv), dtype=torch.float64)
    return logp[None], old[None], adv, torch.ones(1, len(ratios))


@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("logp_new,adv,objective", [
    (math.log(1.4), 2.0, 2.4),    # A > 0, ratio above 1 + eps: clipped at 1.2 * 2
    (math.log(0.6), -2.0, -1.6),  # A < 0, ratio below 1 - eps: clipped at 0.8 * -2
    (math.log(0.6), 2.0, 1.2),    # out of range in the wrong direction: unclipped 0.6 * 2
    (math.log(1.4), -2.0, -2.8),  # out of range in the wrong direction: unclipped 1.4 * -2
    (0.0, 0.0, 0.0),
])
def test_scalar_clipped_objective_cases_of_lesson_5(logp_new, adv, objective, dual_clip):
    """Seed 001 (lesson 5) asserts ppo_objective(logp_new, 0, A, 0.2) on these five cases.

    Our loss is the negated objective; the dual clip (c=3 floor at 3A = -6) is inactive here.
    """
    logp = torch.tensor([[logp_new]], dtype=torch.float64, requires_grad=True)
    loss, _ = clipped_policy_loss(logp, torch.zeros(1, 1, dtype=torch.float64),
                                  torch.tensor([[adv]], dtype=torch.float64), torch.ones(1, 1),
                                  dual_clip=dual_clip, mode="seq_mean_token_sum")
    assert -loss.item() == pytest.approx(objective, abs=1e-9)


# The book's §8.2 six-token table (its printed output was stripped from the seed): ratios
# from 0.5 to 2 including 0.5, 0.79, 1.3 and 2.0, two of six clipped per row. The two
# in-range ratios 0.9 and 1.1 are our choice.
SIX_RATIOS = [0.5, 0.79, 0.9, 1.1, 1.3, 2.0]


@pytest.mark.parametrize("adv,zero_grad_ratios", [(+1.0, {1.3, 2.0}), (-1.0, {0.5, 0.79})])
def test_per_sign_clipped_gradients_six_token_table(adv, zero_grad_ratios):
    logp, old, A, mask = _one_row(SIX_RATIOS, adv)
    loss, stats = clipped_policy_loss(logp, old, A, mask, dual_clip=None, mode="seq_mean_token_sum")
    ascent = -torch.autograd.grad(loss, logp)[0][0]  # d objective / d log pi per token
    for rho, g in zip(SIX_RATIOS, ascent.tolist()):
        if rho in zero_grad_ratios:
            assert g == 0.0, (rho, g)
        else:
            assert g == pytest.approx(rho * adv), (rho, g)  # d rho / d log pi = rho
    assert stats["clip_frac"] == pytest.approx(2 / 6)
    # the 0.79 token: clipped for A < 0, still pushed for A > 0 (the asymmetry)
    assert (ascent[1] == 0) == (adv < 0)
    # ratio extremes and k3 approx KL over the row
    assert stats["ratio_min"] == pytest.approx(0.5) and stats["ratio_max"] == pytest.approx(2.0)
    k3 = sum(r - 1 - math.log(r) for r in SIX_RATIOS) / 6
    assert stats["approx_kl"] == pytest.approx(k3)


def test_clip_higher_uses_separate_upper_bound():
    logp, old, A, mask = _one_row([1.25], +1.0)
    _, sym = clipped_policy_loss(logp, old, A, mask, clip_low=0.2, clip_high=0.2)
    loss, dapo = clipped_policy_loss(logp, old, A, mask, clip_low=0.2, clip_high=0.28)
    assert sym["clip_frac"] == 1.0 and dapo["clip_frac"] == 0.0
    assert torch.autograd.grad(loss, logp)[0].item() == pytest.approx(-1.25)
    logp, old, A, mask = _one_row([0.75], -1.0)  # lower bound follows clip_low only
    _, low = clipped_policy_loss(logp, old, A, mask, clip_low=0.2, clip_high=0.28)
    _, lower = clipped_policy_loss(logp, old, A, mask, clip_low=0.3, clip_high=0.28)
    assert low["clip_frac"] == 1.0 and lower["clip_frac"] == 0.0


def test_dual_clip_caps_loss_27_to_8():
    """Book §8.2: ratios 2, 5, 20 with A = -1. Unclipped the loss is 2 + 5 + 20 = 27 and the
    ratio-20 token gets ten times the gradient of the ratio-2 one; with c = 3 the two tokens
    above 3 each contribute the constant c * |A| = 3 with no gradient: 2 + 3 + 3 = 8."""
    logp, old, A, mask = _one_row([2.0, 5.0, 20.0], -1.0)
    loss, stats = clipped_policy_loss(logp, old, A, mask, dual_clip=None, mode="seq_mean_token_sum")
    assert loss.item() == pytest.approx(27.0)
    grad = torch.autograd.grad(loss, logp)[0][0]
    assert grad.tolist() == pytest.approx([2.0, 5.0, 20.0])  # d(-rho*A)/d log pi = rho
    assert stats["dual_clip_frac"] == 0.0
    loss, stats = clipped_policy_loss(logp, old, A, mask, dual_clip=3.0, mode="seq_mean_token_sum")
    assert loss.item() == pytest.approx(8.0)
    grad = torch.autograd.grad(loss, logp)[0][0]
    assert grad.tolist() == pytest.approx([2.0, 0.0, 0.0])
    assert stats["dual_clip_frac"] == pytest.approx(2 / 3)
    assert stats["clip_frac"] == 0.0  # ratios above 1 with A < 0 are never ratio-clipped
    # the dual clip never touches positive advantages
    logp, old, A, mask = _one_row([2.0, 5.0, 20.0], +1.0)
    loss, _ = clipped_policy_loss(logp, old, A, mask, dual_clip=3.0, mode="seq_mean_token_sum")
    assert loss.item() == pytest.approx(-3 * 1.2)
    with pytest.raises(ValueError, match="dual_clip"):
        clipped_policy_loss(logp, old, A, mask, dual_clip=0.5)


def test_first_ratio_is_one_gives_plain_policy_gradient_and_masked_tokens_ignored():
    torch.manual_seed(0)
    logp = torch.randn(2, 6, requires_grad=True)
    adv = torch.randn(2, 6)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 1, 1]], dtype=torch.float)
    loss, stats = clipped_policy_loss(logp, logp.detach(), adv, mask)
    assert stats == pytest.approx(dict(clip_frac=0.0, dual_clip_frac=0.0, approx_kl=0.0, ratio_min=1.0,
                                       ratio_max=1.0))
    grad = torch.autograd.grad(loss, logp)[0]
    # at rho = 1 the clipped surrogate's gradient equals REINFORCE's (grad of rho at 1 = grad log pi)
    expected = torch.autograd.grad(reinforce_loss(logp, adv, mask), logp)[0]
    torch.testing.assert_close(grad, expected)
    # a huge ratio on a masked token changes neither loss nor stats
    old = logp.detach().clone()
    old[0, 4] = -30.0
    loss2, stats2 = clipped_policy_loss(logp, old, adv, mask)
    assert loss2.item() == pytest.approx(loss.item()) and stats2["ratio_max"] == 1.0


# ---------------------------------------------------------------- clipped_value_loss

def test_clipped_value_loss_by_hand():
    old = torch.tensor([[1.0, 1.0, 1.0]])
    ret = torch.tensor([[2.0, 2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    values = torch.tensor([[1.5, 0.5, 7.0]], requires_grad=True)
    loss = clipped_value_loss(values, old, ret, mask, clip=0.2, mode="seq_mean_token_sum")
    # token 0: unclipped (1.5-2)^2 = 0.25, clipped (1.2-2)^2 = 0.64 -> max 0.64, no gradient
    # token 1: unclipped (0.5-2)^2 = 2.25, clipped (0.8-2)^2 = 1.44 -> max 2.25, gradient (0.5-2)
    assert loss.item() == pytest.approx(0.5 * (0.64 + 2.25))
    grad = torch.autograd.grad(loss, values)[0]
    assert grad[0].tolist() == pytest.approx([0.0, -1.5, 0.0])
    plain = clipped_value_loss(values, old, ret, mask, clip=None, mode="token_mean")
    assert plain.item() == pytest.approx(0.5 * (0.25 + 2.25) / 2)


# ---------------------------------------------------------------- kl_estimate

def test_kl_estimators_by_hand_and_k3_nonnegative():
    logp = torch.log(torch.tensor([0.5, 0.25]))
    ref = torch.log(torch.tensor([0.25, 0.5]))
    # token 0: log r = log(0.25/0.5) = -log 2; token 1: log r = +log 2
    l2 = math.log(2)
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([l2, -l2])
    assert kl_estimate(logp, ref, "k2").tolist() == pytest.approx([0.5 * l2 ** 2] * 2)
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([0.5 - 1 + l2, 2 - 1 - l2])
    torch.manual_seed(0)
    a, b = 3 * torch.randn(1000), 3 * torch.randn(1000)
    assert (kl_estimate(a, b, "k3") >= 0).all() and (kl_estimate(a, b, "k2") >= 0).all()
    assert (kl_estimate(a, b, "k1") < 0).any()  # k1 is not nonnegative per token
    with pytest.raises(ValueError, match="k1, k2, k3"):
        kl_estimate(a, b, "k4")


def test_k1_and_k3_are_unbiased_for_kl_pi_ref():
    pi = torch.tensor([0.6, 0.3, 0.1], dtype=torch.float64)
    ref = torch.tensor([0.2, 0.5, 0.3], dtype=torch.float64)
    exact = (pi * (pi / ref).log()).sum().item()
    idx = torch.multinomial(pi, 400_000, replacement=True, generator=torch.Generator().manual_seed(0))
    for kind in ("k1", "k3"):
        est = kl_estimate(pi.log()[idx], ref.log()[idx], kind).mean().item()
        assert est == pytest.approx(exact, rel=0.02), kind
    k2 = kl_estimate(pi.log()[idx], ref.log()[idx], "k2").mean().item()
    assert abs(k2 - exact) > 0.02  # k2 is biased this far from ref


# ---------------------------------------------------------------- tool_output_mask

def test_tool_output_mask_by_hand_picks_the_outputs_of_the_named_calls():
    P, O, R = 2, 3, 1  # policy, tool, prompt owners
    # prompt [2], call "10 11", its output [2], call "20 21", its output [2], pad
    ids = torch.tensor([[1, 2, 10, 11, 5, 6, 20, 21, 7, 8, 0]])
    owner = torch.tensor([[R, R, P, P, O, O, P, P, O, O, 0]])
    # aligned with the targets ids[1:]: position t is 1 when ids[t+1] is an output of a named call
    assert tool_output_mask(ids, owner).tolist() == [[0, 0, 0, 1, 1, 0, 0, 1, 1, 0]]
    assert tool_output_mask(ids, owner, [10]).tolist() == [[0, 0, 0, 1, 1, 0, 0, 0, 0, 0]]
    assert tool_output_mask(ids, owner, [20]).tolist() == [[0, 0, 0, 0, 0, 0, 0, 1, 1, 0]]
    assert tool_output_mask(ids, owner, [11]).sum() == 0  # a call is named by its first token
    # tool tokens before any call answer none of them, even after a first token equal to a named call's
    assert tool_output_mask(torch.tensor([[10, 5, 6]]), torch.tensor([[R, O, O]]), [10]).sum() == 0
