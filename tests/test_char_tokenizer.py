"""A text env that advertises no tokenizer trains with a character-level one of its Text spaces' charset."""

from __future__ import annotations

import warnings

import gymnasium as gym
import pytest
from gymnasium import spaces

from agents.algorithms.ppo import TokenPPO
from agents.model.char_tokenizer import CharTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, tokenizer_from_dict


class SayTheWord(gym.Env):
    """One step: the prompt names a word, the reward is 1 if the call says it."""

    WORDS = ("cat", "dog", "owl")
    observation_space = spaces.Text(32, charset="abcdefghijklmnopqrstuvwxyz :")
    action_space = spaces.Text(8, charset="abcdefghijklmnopqrstuvwxyz")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = self.WORDS[int(self.np_random.integers(len(self.WORDS)))]
        return f"say: {self.word}", {}

    def step(self, action):
        return "", float(action.strip() == self.word), True, False, {}


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
