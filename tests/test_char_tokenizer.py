"""A text env that advertises no tokenizer trains with a character-level one of its Text spaces' charset."""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path

import pytest
from gymnasium import spaces

from agents.algorithms.ppo import TokenPPO
from agents.model.char_tokenizer import CharTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, tokenizer_from_dict


def _say_the_word() -> type:
    """The one-step "say the word" env of benchmarks/from_scratch.py (one definition for the benchmark and here)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "from_scratch.py"
    spec = importlib.util.spec_from_file_location("benchmark_from_scratch", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SayTheWord


SayTheWord = _say_the_word()


def test_the_tokenizer_reads_characters_and_travels_as_its_own_format():
    tok = CharTokenizer.for_spaces(SayTheWord.observation_space, SayTheWord.action_space)
    assert tok.vocab_size == 5 + 28  # the specials, 26 letters, space and colon
    assert tok.decode(tok.encode("say: owl")) == "say: owl" and len(tok.encode("owl")) == 3
    assert tok.encode("é") == [tok.unk_id]
    assert tok.segment_ids(OWNER_POLICY, "owl")[-1] == tok.eoc_id
    assert tok.segment_ids(OWNER_PROMPT, "say")[-1] == tok.turn_id
    back = tokenizer_from_dict(tok.to_dict())
    assert isinstance(back, CharTokenizer) and back.to_dict() == tok.to_dict()
    assert CharTokenizer.for_spaces(spaces.Discrete(3)) is None
    with pytest.raises(ValueError, match="single characters"):
        CharTokenizer(["ab"])


def test_an_env_without_a_tokenizer_trains_with_a_character_level_one_said_once(tmp_path):
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        model = TokenPPO("TinyAgentPolicy", SayTheWord(), base_agent=None, n_episodes=8, seed=0)
    assert sum("character-level" in str(w.message) for w in said) == 1
    assert isinstance(model.policy.tokenizer, CharTokenizer)
    model.learn(16)
    model.save(tmp_path / "m.zip")
    loaded = TokenPPO.load(tmp_path / "m.zip")
    assert loaded.policy.tokenizer.to_dict() == model.policy.tokenizer.to_dict()
    obs, _ = SayTheWord().reset(seed=1)
    assert loaded.predict(obs, deterministic=True)[0] == model.predict(obs, deterministic=True)[0]


def test_the_warning_says_a_free_text_policy_needs_the_env_s_calls():
    """From random weights a character-level policy writing free text never spells a rewarded word
    (benchmarks/from_scratch.py: 0.0 after 4,000 episodes whatever ent_coef), so the one warning says
    to give the calls; with a call grammar it does not."""
    def said(policy_kwargs):
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            TokenPPO("TinyAgentPolicy", SayTheWord(), base_agent=None, n_episodes=8, seed=0,
                     policy_kwargs=policy_kwargs)
        return " ".join(str(w.message) for w in seen if "character-level" in str(w.message))

    assert "call_grammar=[...]" in said(None)
    assert "character-level" in said(dict(call_grammar=list(SayTheWord.WORDS)))
    assert "call_grammar" not in said(dict(call_grammar=list(SayTheWord.WORDS)))


@pytest.mark.slow
def test_from_scratch_with_the_defaults_and_a_call_grammar_learns_to_say_the_word():
    """The defaults learn the one-step env from random weights, character by character, once the
    calls are given as a grammar (seed 0; docs/ppo.md has three seeds of each setting)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = TokenPPO("TinyAgentPolicy", SayTheWord(), base_agent=None, seed=0, torch_threads=1,
                         policy_kwargs=dict(call_grammar=list(SayTheWord.WORDS)))
    model.learn(4000)
    env, wins = SayTheWord(), 0
    for k in range(100):
        obs, _ = env.reset(seed=1000 + k)
        wins += int(env.step(model.predict(obs)[0])[1])
    assert wins >= 90
