"""From-scratch TokenPPO on a one-step "say the word" text env that advertises no tokenizer (so the
policy reads and writes characters, :class:`agents.model.char_tokenizer.CharTokenizer`) and
``base_agent=None`` (random initial weights): the pass rate on fresh episodes after a budget of
episodes, per seed, for the settings given (default: the defaults).

    OMP_NUM_THREADS=1 nice python -m benchmarks.from_scratch --episodes 4000 --seeds 0 1 2 --set ent_coef=0.01
    OMP_NUM_THREADS=1 nice python -m benchmarks.from_scratch --grammar --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import json
import time
import warnings

import gymnasium as gym
import torch
from gymnasium import spaces

from agents.algorithms.ppo import TokenPPO
from bugfix_gym.contract.tokens import Tokenizer


class SayTheWord(gym.Env):
    """One step: the prompt names one of ``WORDS``; the reward is 1 if the call says it, else 0."""

    WORDS = ("cat", "dog", "owl")
    observation_space = spaces.Text(32, charset="abcdefghijklmnopqrstuvwxyz :")
    action_space = spaces.Text(8, charset="abcdefghijklmnopqrstuvwxyz")

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.word = self.WORDS[int(self.np_random.integers(len(self.WORDS)))]
        return f"say: {self.word}", {}

    def step(self, action):
        return "", float(str(action).strip() == self.word), True, False, {}


def pass_rate(model: TokenPPO, episodes: int, seed: int) -> float:
    """The share of ``episodes`` fresh episodes whose sampled call (temperature 1) says the word."""
    env, wins = SayTheWord(), 0
    for k in range(episodes):
        obs, _ = env.reset(seed=10_000 + seed * episodes + k)
        call, _ = model.predict(obs, deterministic=False)
        wins += int(env.step(call)[1])
    return wins / episodes


def policy_kwargs(grammar: bool, words: bool) -> dict:
    """The policy's arguments: a call grammar of the three words and / or a word tokenizer of the env's words."""
    out: dict = {}
    if grammar:
        out["call_grammar"] = list(SayTheWord.WORDS)
    if words:
        out["tokenizer"] = Tokenizer(["say", ":", *SayTheWord.WORDS])
    return out


def run(settings: dict, episodes: int, seed: int, grammar: bool = False, words: bool = False) -> dict:
    """Train from scratch for ``episodes`` episodes and evaluate; returns the seed's figures. ``grammar``:
    decode under a call grammar of the three words (else free text); ``words``: a word tokenizer of the
    env's words (else the character-level one TokenPPO builds)."""
    torch.manual_seed(seed)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the character-level tokenizer's one warning
        model = TokenPPO("TinyAgentPolicy", SayTheWord(), base_agent=None, seed=seed, torch_threads=1,
                         policy_kwargs=policy_kwargs(grammar, words), **settings)
    model.learn(episodes)
    return dict(seed=seed, pass_rate=pass_rate(model, 300, seed), seconds=round(time.perf_counter() - start, 1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=4000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--grammar", action="store_true", help="decode under a call grammar of the three words")
    parser.add_argument("--words", action="store_true", help="a word tokenizer instead of the character-level one")
    parser.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE", help="TokenPPO settings (JSON values)")
    args = parser.parse_args()
    settings = {k: json.loads(v) for k, v in (s.split("=", 1) for s in args.set)}
    for seed in args.seeds:
        print(json.dumps(dict(settings=settings, grammar=args.grammar, words=args.words, episodes=args.episodes,
                              **run(settings, args.episodes, seed, args.grammar, args.words))), flush=True)


if __name__ == "__main__":
    main()
