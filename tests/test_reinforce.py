"""Reinforce in SB3's shape: the zero-advantage skip, a real update, baselines, learning, save/load."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import KVWriter, Logger

from agents.bugfix.base_agent import make_base_agent
from agents.algorithms.callbacks import StopAfterIterations
from agents.model.tinyagent import TinyAgentConfig, sequence_log_probs
from agents.algorithms.reinforce import Reinforce, policy_gradient_step
from agents.rollout.trajectory import collate
from agents.bugfix.evaluation import evaluate, sample_episodes
from bugfix_gym import build_tokenizer, make_tasks


@pytest.fixture(scope="module")
def tiny():
    """A small TinyAgent behaviour-cloned on scripted play (seconds, not the full base agent)."""
    tok = build_tokenizer(make_tasks("all"))
    config = TinyAgentConfig(vocab_size=tok.vocab_size, d_model=32, n_layer=1, n_head=2, d_ff=64, max_len=256)
    base = make_base_agent(tok, steps=150, batch_size=16, episodes_per_task=4, config=config)
    return tok, base


def _params(model):
    return torch.cat([p.detach().flatten().clone() for p in model.parameters()])


def _agent(tok, base, tasks=None, n_envs=4, **kw) -> Reinforce:
    env = make_vec_env("BugFix-v0", n_envs=n_envs, seed=kw.get("seed", 0),
                       env_kwargs=None if tasks is None else dict(tasks=tasks))
    return Reinforce("TinyAgentPolicy", env, base_agent=copy.deepcopy(base), policy_kwargs=dict(tokenizer=tok), **kw)


def _batch(tok, base, n=16, seed=0):
    agent = _agent(tok, base, seed=seed)
    trajs = sample_episodes(base, make_tasks("train")[:4], n // 4, seed=seed, tokenizer=tok)
    return agent, collate(trajs, tok.pad_id)


def test_zero_advantage_step_is_skipped_even_after_adam_has_momentum(tiny):
    tok, base = tiny
    agent, batch = _batch(tok, base)
    model, opt = agent.policy.model, agent.policy.optimizer
    adv = torch.linspace(-1, 1, len(batch["rewards"]))
    first = policy_gradient_step(model, opt, batch, adv)  # builds Adam momentum
    assert not first["skipped"] and first["grad_norm"] > 0
    before = _params(model)
    stats = policy_gradient_step(model, opt, batch, torch.zeros(len(batch["rewards"])))
    assert stats == dict(loss=0.0, grad_norm=0.0, skipped=True)
    assert torch.equal(_params(model), before)
    # per-token advantages that are non-zero only off the policy mask carry no signal either
    off_mask = (1 - batch["policy_mask"]) * 3.0
    assert policy_gradient_step(model, opt, batch, off_mask)["skipped"]
    assert torch.equal(_params(model), before)
    # without the skip, Adam's momentum moves the weights on a zero gradient (book §6.8)
    stats = policy_gradient_step(model, opt, batch, torch.zeros(len(batch["rewards"])), skip_zero=False)
    assert stats["grad_norm"] == 0.0 and not torch.equal(_params(model), before)


def test_policy_gradient_step_raises_logp_of_advantaged_tokens(tiny):
    tok, base = tiny
    agent, batch = _batch(tok, base, seed=1)
    model, opt = agent.policy.model, agent.policy.optimizer
    mask = batch["policy_mask"]
    adv = torch.zeros(len(batch["rewards"]))
    adv[0] = 1.0  # push up the first trajectory only
    with torch.no_grad():
        lp_before = (sequence_log_probs(model, batch["ids"])[0] * mask[0]).sum()
    stats = policy_gradient_step(model, opt, batch, adv, max_grad_norm=1.0)
    assert not stats["skipped"] and stats["grad_norm"] > 0
    with torch.no_grad():
        lp_after = (sequence_log_probs(model, batch["ids"])[0] * mask[0]).sum()
    assert lp_after > lp_before


class Capture(KVWriter):
    def __init__(self):
        self.rows: list[dict] = []

    def write(self, key_values, key_excluded, step=0):
        self.rows.append(dict(key_values))


def test_ema_baseline_is_fixed_before_the_batch_and_logged(tiny):
    tok, base = tiny
    agent = _agent(tok, base, n_episodes=8, baseline_init=0.25, ema_decay=0.5, seed=2)
    cap = Capture()
    agent.set_logger(Logger(folder=None, output_formats=[cap]))
    agent.learn(10**6, callback=StopAfterIterations(3))
    entries = agent.diagnostics
    assert len(entries) == 3 and entries[0]["baseline"] == 0.25
    for prev, cur in zip(entries, entries[1:]):  # b_k = 0.5 b_{k-1} + 0.5 mean(R_{k-1})
        assert cur["baseline"] == pytest.approx(0.5 * prev["baseline"] + 0.5 * prev["reward"])
    keys = set().union(*cap.rows)
    assert {"train/loss", "train/grad_norm", "train/baseline", "rollout/ep_rew_mean", "time/fps"} <= keys


@pytest.mark.slow
def test_short_seeded_run_improves_pass_rate_on_two_tasks(tiny):
    """REINFORCE on two train tasks (clamp: swap_minmax, sum_to: fix_range_end), 32 episodes per update."""
    tok, base = tiny
    by_op = {}
    for task in make_tasks("train"):
        by_op.setdefault(task.fix_op, task)
    tasks = [by_op["swap_minmax"], by_op["fix_range_end"]]
    agent = _agent(tok, base, tasks=tasks, n_envs=16, n_episodes=32, learning_rate=1.5e-3, seed=0)
    before = evaluate(agent, tasks, 32, seed=1)["pass_rate"]
    agent.learn(10**6, callback=StopAfterIterations(60))
    after = evaluate(agent, tasks, 32, seed=1)["pass_rate"]
    assert agent._iteration == 60
    assert after >= before + 0.4 and after >= 0.6, (before, after)


def test_save_load_roundtrip_continues_identically(tiny, tmp_path):
    tok, base = tiny
    agent = _agent(tok, base, n_episodes=8, baseline_init=0.1, seed=0)
    agent.learn(10**6, callback=StopAfterIterations(2))
    path = tmp_path / "reinforce.zip"
    agent.save(path)
    loaded = Reinforce.load(path, env=agent.env)
    for a, b in zip(agent.policy.state_dict().values(), loaded.policy.state_dict().values()):
        assert torch.equal(a, b)
    assert loaded._iteration == 2 and loaded.ema.value == pytest.approx(agent.ema.value)
    assert loaded.policy.optimizer.defaults["eps"] == 1e-8  # the book's Adam, kept through the file
    obs = "fix the function clamp"
    gen_a, gen_b = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert agent.policy.generate_calls([tok.encode(obs)], generator=gen_a) == \
        loaded.policy.generate_calls([tok.encode(obs)], generator=gen_b)
    bad = tmp_path / "bad.zip"
    bad.write_text("not a checkpoint")
    with pytest.raises(ValueError, match="not a bugfix-gym model file"):
        Reinforce.load(bad)
    with pytest.raises(ValueError, match="load it with Reinforce"):
        from agents.algorithms.ppo import TokenPPO
        TokenPPO.load(path)


@pytest.mark.parametrize("kw, match", [(dict(baseline="median"), "baseline"), (dict(loss_mode="sum"), "loss_mode"),
                                       (dict(adv_estimator="gae2"), "adv_estimator"),
                                       (dict(ema_decay=2.0), "ema_decay"), (dict(n_episodes=0), "n_episodes")])
def test_bad_arguments(tiny, kw, match):
    tok, base = tiny
    with pytest.raises(ValueError, match=match):
        _agent(tok, base, **kw)


def test_reward_to_go_advantages_differ_per_token(tiny):
    """With a call cost, G_t - b differs between a trajectory's calls; with R - b it does not."""
    tok, base = tiny
    env = make_vec_env("BugFix-v0", n_envs=4, seed=0, env_kwargs=dict(call_cost=0.1))
    agent = Reinforce("TinyAgentPolicy", env, base_agent=copy.deepcopy(base), policy_kwargs=dict(tokenizer=tok),
                      n_episodes=8, use_reward_to_go=True, seed=0)
    agent.learn(10**6, callback=StopAfterIterations(1))
    assert np.isfinite(agent.diagnostics[-1]["loss"]) and not agent.diagnostics[-1]["skipped"]


# ---------------------------------------------------------------------- variants by name
@pytest.fixture
def toy_variants():
    """A toy loss aggregation, policy loss and advantage estimator, registered for one test."""
    from agents.algorithms.advantages import ADVANTAGE_ESTIMATORS, register_adv_est
    from agents.algorithms.losses import LOSS_AGGREGATIONS, POLICY_LOSSES, register_policy_loss, register_loss_agg
    from agents.algorithms.losses import reinforce_loss

    calls = []

    @register_loss_agg("toy_sum")
    def toy_sum(per_token, mask, norm_const):  # the batch's plain sum: "constant" with C = 1
        return (per_token * mask).sum()

    @register_policy_loss("toy_pg")
    def toy_pg(logp, old_logp, advantages, mask, config):
        calls.append(("policy_loss", tuple(logp.shape), bool(torch.equal(old_logp, logp.detach()))))
        return reinforce_loss(logp, advantages, mask, config.mode, config.norm_const), {}

    @register_adv_est("toy_return")
    def toy_return(batch, config):  # the episode's return, no baseline
        calls.append(("adv_estimator", tuple(batch.rewards.shape), batch.baseline))
        return batch.rewards.clone(), None

    yield calls
    LOSS_AGGREGATIONS.unregister("toy_sum")
    POLICY_LOSSES.unregister("toy_pg")
    ADVANTAGE_ESTIMATORS.unregister("toy_return")


def test_a_registered_variant_trains_like_the_built_in_it_copies(tiny, toy_variants):
    """One function plus one registration per variant: Reinforce runs the toys by name, and they
    update the weights bit for bit as the built-ins they copy (constant mode with C = 1, no baseline)."""
    tok, base = tiny

    def agent(**kw):  # a call cost: every episode's return is non-zero
        env = make_vec_env("BugFix-v0", n_envs=4, seed=0, env_kwargs=dict(call_cost=0.1))
        model = Reinforce("TinyAgentPolicy", env, base_agent=copy.deepcopy(base), policy_kwargs=dict(tokenizer=tok),
                          n_episodes=8, seed=0, baseline="none", **kw)
        model.learn(10**6, callback=StopAfterIterations(2))
        return model

    toy = agent(loss_mode="toy_sum", policy_loss="toy_pg", adv_estimator="toy_return")
    built_in = agent(loss_mode="constant", loss_norm_const=1.0)
    assert [c[0] for c in toy_variants] == ["adv_estimator", "policy_loss"] * 2
    assert all(c[2] for c in toy_variants if c[0] == "policy_loss")  # pi_old is the policy itself
    assert torch.equal(_params(toy.policy.model), _params(built_in.policy.model))
    assert not torch.equal(_params(toy.policy.model), _params(base))
    with pytest.raises(ValueError, match="policy_loss must be one of .*toy_pg"):
        _agent(tok, base, policy_loss="toy")
