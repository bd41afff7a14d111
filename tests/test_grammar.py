"""Grammar-constrained decoding: the trie, and PPO / predict / save-load under the grammar."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.grammar import NO_STATE, CallGrammar
from agents.ppo import TokenPPO


def _paths(grammar: CallGrammar, state: int, prefix: list[int], eoc: int) -> list[list[int]]:
    out = []
    for t in torch.nonzero(grammar.allowed[state]).flatten().tolist():
        out += [prefix + [t]] if t == eoc else _paths(grammar, grammar.step(state, t), prefix + [t], eoc)
    return out


def test_the_trie_accepts_exactly_the_nine_calls(tok):
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    paths = _paths(grammar, grammar.start, [], tok.eoc_id)
    assert sorted(tok.decode(p) for p in paths) == sorted(bugfix_gym.CALLS)
    first = {tok.words[t] for t in torch.nonzero(grammar.allowed[grammar.start]).flatten().tolist()}
    assert first == {"read", "test", "edit", "revert", "submit"}  # no empty call: <eoc> is not allowed first
    after_edit = grammar.step(grammar.start, tok.ids["edit"])
    assert {tok.words[t] for t in torch.nonzero(grammar.allowed[after_edit]).flatten()} == set(bugfix_gym.FIX_OPS)
    assert grammar.max_call_tokens == 3
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(grammar.start, tok.eoc_id)
    with pytest.raises(ValueError, match="does not know"):
        CallGrammar(tok, ("read", "zyzzyva"))
    logits = torch.randn(2, tok.vocab_size)
    out = grammar.mask_logits(logits, torch.tensor([NO_STATE, grammar.start]))
    assert torch.equal(out[0], logits[0]) and torch.isinf(out[1][~grammar.allowed[0]]).all()


class RecordingPPO(TokenPPO):
    def _minibatch_loss(self, sample, clip_low, clip_high):
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.seen = getattr(self, "seen", []) + [stats]
        return loss, stats


def test_constrained_ppo_first_ratio_is_exactly_one(shared_base_agent, tok):
    model = RecordingPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=6, seed=1), base_agent=shared_base_agent,
                         n_episodes=12, n_minibatches=3, n_epochs=2, seed=1, learning_rate=3e-3, critic_warmup_steps=0,
                         target_kl=None, policy_kwargs=dict(tokenizer=tok, call_grammar=bugfix_gym.CALLS))
    trajs = model.sample_episodes(n=12)
    assert all(a in bugfix_gym.CALLS for t in trajs for a in t.info["actions"])
    model.train_on_batch(trajs)
    first = model.seen[0]
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0 and first["approx_kl"] == 0.0
    assert max(s["ratio_max"] for s in model.seen[1:]) > 1 + 1e-3


def test_constrained_policy_predicts_legal_calls_and_keeps_its_grammar_through_a_file(tmp_path, shared_base_agent,
                                                                                      tok):
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
                     policy_kwargs=dict(tokenizer=tok, call_grammar=bugfix_gym.CALLS))
    model.save(tmp_path / "m.zip")
    loaded = TokenPPO.load(tmp_path / "m.zip")
    assert loaded.policy.grammar is not None and loaded.policy.call_grammar == tuple(bugfix_gym.CALLS)
    env = bugfix_gym.BugFixEnv()
    obs, _ = env.reset(options={"task": "clamp"})
    state, start = None, [True]
    for _ in range(6):
        action, state = loaded.predict(obs, state=state, episode_start=start)
        start = [False]
        assert str(action) in bugfix_gym.CALLS
        obs, _, terminated, truncated, _ = env.step(str(action))
        if terminated or truncated:
            break
