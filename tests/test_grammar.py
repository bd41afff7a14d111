"""Grammar-constrained decoding: the trie, constrained sampling, and scoring the same masked distribution."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

import bugfix_gym
from agents.grammar import MASKED_LOGIT, NO_STATE, CallGrammar, mask_logits
from agents.model import TinyAgent, sequence_logp_values_entropy
from agents.ppo import TokenPPO, score_by_length
from agents.rollout import collate, rollout_batch
from agents_fixtures import base_agent, one_thread, tok  # noqa: F401  (fixtures)

pytestmark = pytest.mark.usefixtures("one_thread")


def _paths(grammar: CallGrammar, state: int, prefix: list[int]) -> list[list[int]]:
    if grammar.is_final(state):
        return [prefix]
    out = []
    for t in torch.nonzero(grammar.allowed[state]).flatten().tolist():
        out += _paths(grammar, grammar.step(state, t), prefix + [t])
    return out


def test_the_trie_accepts_exactly_the_nine_calls(tok):  # noqa: F811
    grammar = CallGrammar(tok)
    paths = _paths(grammar, grammar.start, [])
    assert sorted(tok.decode(p) for p in paths) == sorted(bugfix_gym.CALLS)
    assert all(p[-1] == tok.eoc_id and tok.eoc_id not in p[:-1] for p in paths)
    first = {tok.words[t] for t in torch.nonzero(grammar.allowed[grammar.start]).flatten().tolist()}
    assert first == {"read", "test", "edit", "revert", "submit"}
    after_edit = grammar.step(grammar.start, tok.ids["edit"])
    assert {tok.words[t] for t in torch.nonzero(grammar.allowed[after_edit]).flatten().tolist()} == set(bugfix_gym.FIX_OPS)
    assert grammar.allowed.shape == (grammar.n_states, tok.vocab_size) and grammar.allowed.dtype == torch.bool
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(grammar.start, tok.eoc_id)  # an empty call is not in the grammar
    with pytest.raises(ValueError, match="not made of tokenizer words"):
        CallGrammar(tok, calls=("read", "zyzzyva"))


def test_mask_logits_leaves_unconstrained_positions_alone(tok):  # noqa: F811
    grammar = CallGrammar(tok)
    logits = torch.randn(3, tok.vocab_size)
    out = mask_logits(logits, torch.tensor([NO_STATE, grammar.start, grammar.start]), grammar.allowed)
    assert torch.equal(out[0], logits[0])
    assert torch.equal(out[1][grammar.allowed[0]], logits[1][grammar.allowed[0]])
    assert (out[1][~grammar.allowed[0]] == MASKED_LOGIT).all()


def test_constrained_sampling_writes_only_grammatical_calls_even_untrained(tok):  # noqa: F811
    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size)
    tasks = bugfix_gym.make_tasks("train")[:8]
    grammar = CallGrammar(tok)
    trajs = rollout_batch(model, [bugfix_gym.BugFixEnv() for _ in tasks], tasks, tok,
                          generator=torch.Generator().manual_seed(0), grammar=grammar)
    for traj in trajs:
        assert all(bugfix_gym.parse_call(a) is not None for a in traj.info["actions"])
        on = traj.action_mask > 0
        assert (traj.grammar_state[on] >= 0).all() and (traj.grammar_state[~on] == NO_STATE).all()
    free = rollout_batch(model, [bugfix_gym.BugFixEnv() for _ in tasks], tasks, tok,
                         generator=torch.Generator().manual_seed(0))
    assert sum(t.info["n_invalid"] for t in free) > 0 and (free[0].grammar_state == NO_STATE).all()


def test_trainer_scores_the_masked_distribution_the_sampler_drew_from(base_agent, tok):  # noqa: F811
    grammar = CallGrammar(tok)
    tasks = bugfix_gym.make_tasks("train")[:6]
    trajs = rollout_batch(base_agent, [bugfix_gym.BugFixEnv() for _ in tasks], tasks, tok,
                          generator=torch.Generator().manual_seed(1), grammar=grammar)
    batch = collate(trajs, tok.pad_id)
    mask = batch["action_mask"]
    logp, _, ent = sequence_logp_values_entropy(base_agent, batch["ids"], mask, batch["grammar_state"],
                                                grammar.allowed)
    assert torch.allclose(logp * mask, batch["sample_logp"] * mask, atol=1e-4)
    full_logp, _, full_ent = sequence_logp_values_entropy(base_agent, batch["ids"], None, batch["grammar_state"],
                                                          grammar.allowed)
    assert torch.allclose(full_logp * mask, logp, atol=1e-5) and torch.isfinite(full_ent).all()
    free_logp, _, free_ent = sequence_logp_values_entropy(base_agent, batch["ids"], mask)
    on = mask > 0
    assert (logp[on] >= free_logp[on] - 1e-6).all() and (ent[on] <= free_ent[on] + 1e-5).all()
    chunked = score_by_length(base_agent, batch["ids"], batch["owner"], 2, mask, batch["grammar_state"],
                              grammar.allowed)[0]
    assert torch.allclose(chunked, logp, atol=1e-5)
    # gradients stay finite through the masked entropy
    base_agent.zero_grad()
    logp2, _, ent2 = sequence_logp_values_entropy(base_agent, batch["ids"], mask, batch["grammar_state"],
                                                  grammar.allowed)
    (logp2.sum() + ent2.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in base_agent.parameters() if p.grad is not None)


class RecordingPPO(TokenPPO):
    def _minibatch_loss(self, sample, clip_low, clip_high):
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.seen = getattr(self, "seen", []) + [stats]
        return loss, stats


def test_constrained_ppo_first_ratio_is_exactly_one_and_sampler_agrees(base_agent, tok):  # noqa: F811
    model = RecordingPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base_agent, n_episodes=12,
                         n_minibatches=3, n_epochs=2, seed=1, learning_rate=3e-3, critic_warmup_steps=0,
                         target_kl=None, policy_kwargs=dict(tokenizer=tok, constrained_decoding=True))
    assert model.policy.grammar is not None
    trajs = model.sample_episodes()
    assert all(bugfix_gym.parse_call(a) is not None for t in trajs for a in t.info["actions"])
    model.train_on_batch(trajs)
    first = model.seen[0]
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0 and first["approx_kl"] == 0.0
    assert max(s["ratio_max"] for s in model.seen[1:]) > 1 + 1e-3
    sampler = RecordingPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base_agent, n_episodes=8,
                           n_minibatches=1, n_epochs=1, seed=2, recompute_old_logp=False, critic_warmup_steps=0,
                           policy_kwargs=dict(tokenizer=tok, constrained_decoding=True))
    sampler.train_on_batch(sampler.sample_episodes())
    assert abs(sampler.seen[0]["ratio_min"] - 1) < 1e-4 and abs(sampler.seen[0]["ratio_max"] - 1) < 1e-4


def test_constrained_policy_predict_and_save_load(tmp_path, base_agent, tok):  # noqa: F811
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=base_agent, n_episodes=4, seed=0,
                     policy_kwargs=dict(tokenizer=tok, constrained_decoding=True))
    model.save(tmp_path / "m.zip")
    loaded = TokenPPO.load(tmp_path / "m.zip")
    assert loaded.policy.grammar is not None
    env = bugfix_gym.BugFixEnv()
    obs, _ = env.reset(options={"task": "clamp"})
    state, start = None, [True]
    for _ in range(6):
        action, state = loaded.predict(obs, state=state, episode_start=start)
        start = [False]
        assert bugfix_gym.parse_call(str(action)) is not None
        obs, _, term, trunc, _ = env.step(str(action))
        if term or trunc:
            break
