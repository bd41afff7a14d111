"""A user's own text env (gymnasium's shapeless Text spaces): SB3's tools, the tokenizer, the context, base_agent."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from stable_baselines3.common.callbacks import EvalCallback
from stable_baselines3.common.evaluation import evaluate_policy

import bugfix_gym
from agents import TokenPPO, make_text_vec_env
from agents.algorithms.on_policy import TEXT_SPACE_ADVICE
from bugfix_gym.core.look import COLOURS, LookThenAnswerEnv


def make_env() -> LookThenAnswerEnv:
    """A text env of gymnasium's own Text spaces that advertises no agent defaults."""
    return LookThenAnswerEnv(colours=COLOURS[:4])


def tiny(words, max_len: int = 64, grammar: bool = True) -> dict:
    """policy_kwargs of a tiny model over ``words``, with the env's call grammar (or free text)."""
    tok = bugfix_gym.Tokenizer(words)
    return dict(tokenizer=tok, call_grammar=list(make_env().calls) if grammar else None,
                model_config=dict(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32,
                                  max_len=max_len))


def test_a_plain_text_env_warns_what_sb3_tools_need_and_they_work_with_it():
    with pytest.warns(UserWarning, match="give evaluate_policy and EvalCallback agents.make_text_vec_env"):
        model = TokenPPO("TinyAgentPolicy", make_env(), base_agent=None, n_episodes=8, seed=0,
                         policy_kwargs=tiny(make_env().words))
    assert "\n" not in TEXT_SPACE_ADVICE
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no Monitor warning either
        mean, _ = evaluate_policy(model, make_text_vec_env(make_env), n_eval_episodes=6)
    assert 0.0 <= mean <= 1.0
    callback = EvalCallback(make_text_vec_env(make_env), eval_freq=20, n_eval_episodes=4, verbose=0)
    model.learn(60, callback=callback)
    assert 0.0 <= callback.last_mean_reward <= 1.0  # -inf until it has evaluated


def test_auto_base_agent_with_a_tokenizer_of_ones_own_is_a_one_line_error():
    tok = bugfix_gym.Tokenizer(make_env().words)
    with pytest.raises(ValueError, match="pass base_agent=None") as e:
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), policy_kwargs=dict(tokenizer=tok))
    assert "\n" not in str(e.value)


def test_words_outside_the_vocabulary_warn_once():
    words = [w for w in make_env().words if w not in COLOURS[:4]]  # the tokenizer misses the colours
    model = TokenPPO("TinyAgentPolicy", make_text_vec_env(make_env, n_envs=2), base_agent=None, n_episodes=4,
                     seed=0, policy_kwargs=tiny(words, grammar=False))
    with pytest.warns(UserWarning, match="the tokenizer does not know") as record:
        model.sample_episodes(8)
        model.sample_episodes(8)
    assert sum("does not know" in str(w.message) for w in record) == 1


def test_a_context_shorter_than_a_prompt_and_a_call_is_a_one_line_error():
    model = TokenPPO("TinyAgentPolicy", make_text_vec_env(make_env), base_agent=None, n_episodes=2, seed=0,
                     policy_kwargs=tiny(make_env().words, max_len=16))
    with pytest.raises(ValueError, match=r"more than the model's max_len=16: build it with a model_config max_len"):
        model.learn(10)


def test_a_call_limit_that_leaves_no_room_for_a_prompt_is_refused_when_built():
    with pytest.raises(ValueError, match=r"max_call_tokens=8 must be from 1 to half the model's context of 8"):
        TokenPPO("TinyAgentPolicy", make_text_vec_env(make_env), base_agent=None, n_episodes=2, seed=0,
                 policy_kwargs=tiny(make_env().words, max_len=8))
