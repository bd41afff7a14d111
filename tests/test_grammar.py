"""Grammar-constrained decoding: the trie, and PPO / predict / save-load under the grammar."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.decoding.grammar import NO_STATE, CallGrammar
from agents.algorithms.ppo import TokenPPO
from agents.bugfix.evaluation import sample_episodes


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


def test_a_call_mask_closes_exactly_its_calls_and_keeps_them_closed_through_the_call(tok):
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    assert grammar.start_for(None) == grammar.start == grammar.start_for([True] * 9)
    open_calls = [c not in ("revert", "edit fix_init", "edit swap_minmax", "submit") for c in bugfix_gym.CALLS]
    state = grammar.start_for(open_calls)
    assert state >= grammar.n_nodes  # the closed calls are part of the state the tokens are recorded with
    paths = _paths_from(grammar, state, [], tok.eoc_id)
    assert sorted(tok.decode(p) for p in paths) == sorted(c for c, ok in zip(bugfix_gym.CALLS, open_calls) if ok)
    only_edits = [c.startswith("edit") and c != "edit fix_init" for c in bugfix_gym.CALLS]
    paths = _paths_from(grammar, grammar.start_for(only_edits), [], tok.eoc_id)
    assert sorted(tok.decode(p) for p in paths) == sorted(c for c, ok in zip(bugfix_gym.CALLS, only_edits) if ok)
    no_edit = [not c.startswith("edit") for c in bugfix_gym.CALLS]  # "edit" itself is closed: it leads nowhere
    rows = grammar.mask_logits(torch.zeros(1, tok.vocab_size), torch.tensor([grammar.start_for(no_edit)]))
    assert torch.isinf(rows[0, tok.ids["edit"]]) and not torch.isinf(rows[0, tok.ids["read"]])
    assert grammar.start_for([False] * 9) == grammar.start  # nothing open: the mask cannot be followed
    with pytest.raises(ValueError, match="must list the grammar's calls"):
        grammar.start_for([True] * 8)
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(state, tok.ids["revert"])


def _paths_from(grammar: CallGrammar, state: int, prefix: list[int], eoc: int) -> list[list[int]]:
    """Every token path from ``state`` to the end of a call, read off the masked logits."""
    row = grammar.mask_logits(torch.zeros(1, grammar.allowed.shape[1]), torch.tensor([state]))[0]
    out = []
    for t in torch.nonzero(~torch.isinf(row)).flatten().tolist():
        out += [prefix + [t]] if t == eoc else _paths_from(grammar, grammar.step(state, t), prefix + [t], eoc)
    return out


def _replay_useful(task, actions: list[str]) -> bool:
    """Whether every call of ``actions`` was open in ``info["useful_calls"]`` when it was written."""
    env = bugfix_gym.BugFixEnv()
    _, info = env.reset(options={"task": task})
    for action in actions:
        if not info["useful_calls"][bugfix_gym.CALLS.index(action)]:
            return False
        _, _, _, _, info = env.step(action)
    return True


@pytest.mark.heavy
def test_a_policy_that_follows_useful_calls_never_writes_a_closed_call_and_its_first_ratio_is_one(
        shared_base_agent, tok, tmp_path):
    tasks = bugfix_gym.make_tasks("train")
    model = RecordingPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=8, seed=2), base_agent=shared_base_agent,
                         n_episodes=16, n_minibatches=2, n_epochs=2, seed=2, critic_warmup_steps=0, target_kl=None,
                         policy_kwargs=dict(tokenizer=tok, call_grammar=bugfix_gym.CALLS,
                                            call_mask_key="useful_calls"))
    played = sample_episodes(model, tasks * 3, seed=0)
    assert all(_replay_useful(bugfix_gym.get_task(t.task), t.info["actions"]) for t in played)
    closed = [t for t in played if any(s >= model.policy.grammar.n_nodes for s in t.grammar_state.tolist())]
    assert closed  # some calls were written with a call closed (revert at least, before any edit)
    free = TokenPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=8, seed=2), base_agent=shared_base_agent,
                    n_episodes=16, seed=2, policy_kwargs=dict(tokenizer=tok, call_grammar=bugfix_gym.CALLS))
    unmasked = sample_episodes(free, tasks * 3, seed=0)
    assert not all(_replay_useful(bugfix_gym.get_task(t.task), t.info["actions"]) for t in unmasked)
    model.train_on_batch(model.sample_episodes(n=16))
    assert model.seen[0]["ratio_min"] == 1.0 and model.seen[0]["ratio_max"] == 1.0
    model.save(tmp_path / "m.zip")
    assert RecordingPPO.load(tmp_path / "m.zip").policy.call_mask_key == "useful_calls"
    with pytest.raises(ValueError, match="needs a call grammar"):
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent,
                 policy_kwargs=dict(tokenizer=tok, call_mask_key="useful_calls"))


def test_forced_is_the_one_allowed_token_else_none(tok):
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    assert grammar.forced(grammar.start) is None and grammar.forced(-1) is None  # a choice of calls; no grammar
    after_submit = grammar.step(grammar.start, tok.encode("submit")[0])
    assert grammar.forced(after_submit) == tok.eoc_id  # a call's last word: only <eoc> may follow
    only_submit = grammar.start_for([c == "submit" for c in bugfix_gym.CALLS])
    assert grammar.forced(only_submit) == tok.encode("submit")[0]  # the call mask leaves one call
    for state in (grammar.start, after_submit, only_submit):
        allowed = grammar.mask_logits(torch.zeros(1, tok.vocab_size), torch.tensor([state]))[0].isfinite()
        assert (grammar.forced(state) is not None) == (int(allowed.sum()) == 1)
