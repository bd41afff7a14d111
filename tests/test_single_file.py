"""examples/token_ppo_single_file.py computes the same update as TokenPPO (GAE, whitening, loss)."""

from __future__ import annotations

import importlib.util
import pathlib
import sys

import gymnasium as gym
import torch

from agents.algorithms.advantages import gae_policy_tokens
from agents.algorithms.ppo import TokenPPO
from agents.bugfix.evaluation import sample_episodes
from agents.rollout.trajectory import collate

PATH = pathlib.Path(__file__).resolve().parents[1] / "examples" / "token_ppo_single_file.py"
spec = importlib.util.spec_from_file_location("token_ppo_single_file", PATH)
single = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = single  # dataclasses looks the module up
spec.loader.exec_module(single)


def test_one_update_has_the_loss_tokenppo_computes_on_the_same_batch(shared_base_agent):
    args = single.Args(gae_lambda=0.9, gamma=0.99, ent_coef=0.01)
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=12,
                     n_minibatches=3, gamma=args.gamma, gae_lambda=args.gae_lambda, ent_coef=args.ent_coef,
                     dual_clip=None, forward_chunk=None, critic_warmup_steps=0, seed=3)
    trajs = sample_episodes(model, [t.name for t in model.env.get_attr("tasks")[0][:12]], seed=3)  # as its sampler
    buffer = model.rollout_buffer_class(len(trajs), model.observation_space, model.action_space,
                                        gamma=args.gamma, gae_lambda=args.gae_lambda, **model.rollout_buffer_kwargs)
    buffer.add(trajs)
    model._freeze_old_policy(buffer)
    buffer.compute_returns_and_advantage()
    # the single file's GAE and whitening give the buffer's advantages and returns
    batch = collate(trajs)
    mask = batch["policy_mask"]
    adv, returns = single.gae(batch["token_rewards"], buffer.old_values, mask, args.gamma, args.gae_lambda)
    ref_adv, ref_returns = gae_policy_tokens(batch["token_rewards"], buffer.old_values, mask, args.gamma,
                                             args.gae_lambda)
    torch.testing.assert_close(adv, ref_adv)
    torch.testing.assert_close(returns, ref_returns)
    m = mask > 0
    whitened = torch.where(m, (adv - adv[m].mean()) / (adv[m].std() + 1e-8), torch.zeros_like(adv))
    torch.testing.assert_close(whitened, buffer.advantages, atol=1e-5, rtol=0)
    # one minibatch: the same loss, after a step has moved the policy away from pi_old
    rows = [0, 4, 7, 9]
    sample = buffer._get_samples(rows)
    model.policy.optimizer.zero_grad()
    loss, _ = model._minibatch_loss(next(buffer.get(4)), 0.2, 0.2)
    loss.backward()
    model.policy.optimizer.step()
    ppo_loss, _ = model._minibatch_loss(sample, 0.2, 0.2)
    mb = dict(ids=sample.ids, policy_mask=sample.policy_mask, old_logp=sample.old_logp, old_values=sample.old_values,
              adv=sample.advantages, returns=sample.returns)
    ours, kl = single.ppo_loss(model.policy.model, mb, args)
    assert kl > 0  # the ratios are no longer 1, so the clipping terms are exercised
    torch.testing.assert_close(ours, ppo_loss, atol=1e-6, rtol=1e-5)
