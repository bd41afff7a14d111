"""Groups in the sampler: G episodes of one task share one reset (book and generated tasks, any number
of envs), group indices reach the advantage estimator, dynamic sampling drops zero-variance groups
and its cap holds, the group statistics are logged, and group_size=1 samples what it always did."""

from __future__ import annotations

import hashlib
import itertools
import warnings
from collections import defaultdict

import gymnasium as gym
import pytest
import torch
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

import bugfix_gym
from agents.algorithms import buffers
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.reinforce import Reinforce
from agents.model.tinyagent import TinyAgent
from agents.rollout.sampler import EpisodeSampler, GroupSampling
from agents.rollout.trajectory import Trajectory, group_index, same_return
from agents.rollout.vec_env import TextDummyVecEnv


@pytest.fixture(scope="module")
def untrained(tok) -> TinyAgent:
    """A seeded untrained agent: fast, and its calls vary."""
    torch.manual_seed(0)
    return TinyAgent(tok.vocab_size)


def _by_group(trajs: list[Trajectory]) -> dict[int, list[Trajectory]]:
    groups: dict[int, list[Trajectory]] = defaultdict(list)
    for t in trajs:
        groups[t.group].append(t)
    return dict(groups)


def _prompt(t: Trajectory) -> list[int]:
    return t.ids[t.owner == 1].tolist()


# ---------------------------------------------------------------------- one reset per group
@pytest.mark.heavy
@pytest.mark.parametrize("env_kwargs", [dict(generated="train"), dict()], ids=["generated", "book"])
@pytest.mark.parametrize("n_envs", [1, 3])
def test_group_members_share_one_reset_and_groups_differ(untrained, tok, env_kwargs, n_envs):
    """3 envs, G=2: one group's members run on different envs and in different rounds; all start from
    the same seed, prompt and task, and each group has its own seed."""
    venv = DummyVecEnv([lambda: gym.make("BugFix-v0", **env_kwargs) for _ in range(n_envs)])
    venv.seed(3)
    sampler = EpisodeSampler(venv, tok, groups=GroupSampling(group_size=2))
    batch = sampler.collect(untrained, 11, generator=torch.Generator().manual_seed(0))
    groups = _by_group(batch)
    assert sorted(groups) == list(range(6)) and all(len(g) == 2 for g in groups.values())  # ceil(11 / 2) groups
    for a, b in groups.values():
        assert a.reset_seed == b.reset_seed is not None
        assert _prompt(a) == _prompt(b) and a.task == b.task != ""
    seeds = [g[0].reset_seed for g in groups.values()]
    assert len(set(seeds)) == len(seeds)
    assert len({tuple(_prompt(g[0])) for g in groups.values()}) > 1  # the groups draw different tasks
    assert sampler.group_stats is not None and sampler.group_stats["groups"] == 6
    assert sampler.group_stats["resampled_groups"] == 0


@pytest.mark.heavy
def test_groups_in_subprocess_envs_are_the_groups_of_dummy_envs(untrained, tok):
    """The seeds reach envs in other processes (SubprocVecEnv) just as in-process ones."""
    def run(cls):
        venv = cls([lambda: bugfix_gym.BugFixEnv(generated="train") for _ in range(2)])
        try:
            return EpisodeSampler(venv, tok, groups=GroupSampling(group_size=3)).collect(
                untrained, 6, generator=torch.Generator().manual_seed(2))
        finally:
            venv.close()

    dummy, subproc = run(DummyVecEnv), run(SubprocVecEnv)
    assert [(t.group, t.reset_seed) for t in dummy] == [(t.group, t.reset_seed) for t in subproc]
    assert all(torch.equal(a.ids, b.ids) and a.reward == b.reward for a, b in zip(dummy, subproc))
    assert [len(g) for g in _by_group(subproc).values()] == [3, 3]


def test_one_seed_is_one_generated_function_and_one_book_task():
    """What the groups rely on: BugFix-v0 draws its task from reset(seed=...) alone."""
    for kwargs in (dict(generated="train"), dict()):
        a, b = gym.make("BugFix-v0", **kwargs), gym.make("BugFix-v0", **kwargs)
        a.reset(seed=1)  # a's generator has moved on: the seed alone must decide
        sources = [env.reset(seed=7)[0] for env in (a, b)]
        assert sources[0] == sources[1] and a.unwrapped.source == b.unwrapped.source


@pytest.mark.heavy
def test_group_size_one_samples_what_the_sampler_always_did(untrained, tok):
    """Fresh rounds, one env and episodes across batches with group_size=1: the same episodes, bit for
    bit, as the sampler before groups existed (the digest was recorded with that sampler)."""
    digest = hashlib.sha256()
    for n_envs, n, fresh in ((3, 7, True), (1, 3, True), (2, 5, False)):
        venv = DummyVecEnv([lambda: bugfix_gym.BugFixEnv(generated="train") for _ in range(n_envs)])
        venv.seed(5)
        sampler = EpisodeSampler(venv, tok, groups=GroupSampling(group_size=1))
        gen = torch.Generator().manual_seed(1)
        for _ in range(2):
            for t in sampler.collect(untrained, n, fresh=fresh, generator=gen):
                assert t.group == -1 and t.reset_seed is None
                digest.update(bytes(str((t.ids.tolist(), t.reward, t.task)), "utf8"))
    assert digest.hexdigest() == "c981d8585e4061dfcf823081da915c305e22ce81918419bc4ffa9c0172f5fcd8"
    assert sampler.group_stats is None


# ---------------------------------------------------------------------- a tiny env of certain variance
class CoinTasks(gym.Env):
    """One-step text tasks. ``reset(seed)`` draws the kind: a ``flat`` task pays 0 whatever the call, so
    its groups have zero variance for certain; a ``varied`` task pays a number never paid before, so
    its groups never do. ``flat_share`` = 1 makes every task flat."""

    metadata: dict = {}
    paid = itertools.count(1)

    def __init__(self, flat_share: float = 0.5):
        self.observation_space = spaces.Text(64)
        self.action_space = spaces.Text(64)
        self.flat_share = flat_share

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.kind = "flat" if self.np_random.random() < self.flat_share else "varied"
        return f"task {self.kind}", {"task": self.kind}

    def step(self, action):
        reward = 0.0 if self.kind == "flat" else float(next(self.paid))
        return "done", reward, True, False, {"task": self.kind}


def _coins(n_envs: int, flat_share: float = 0.5) -> TextDummyVecEnv:
    return TextDummyVecEnv([lambda: CoinTasks(flat_share) for _ in range(n_envs)])


@pytest.mark.heavy
@pytest.mark.parametrize("n_envs", [1, 2, 3])
def test_dynamic_sampling_never_keeps_a_zero_variance_group(untrained, tok, n_envs):
    gen = torch.Generator().manual_seed(0)
    plain = EpisodeSampler(_coins(n_envs), tok, groups=GroupSampling(group_size=2))
    kept_all = _by_group(plain.collect(untrained, 16, generator=gen))
    assert any(same_return(g) for g in kept_all.values())  # without dropping, flat groups stay
    assert plain.group_stats is not None and 0 < plain.group_stats["zero_variance_groups"] < 1

    sampler = EpisodeSampler(_coins(n_envs), tok,
                             groups=GroupSampling(group_size=2, drop_zero_variance_groups=True, max_resample_rounds=20))
    batch = sampler.collect(untrained, 16, generator=gen)
    groups = _by_group(batch)
    assert len(batch) == 16 and sorted(groups) == list(range(8)) and all(len(g) == 2 for g in groups.values())
    assert not any(same_return(g) for g in groups.values())
    assert all(t.task == "varied" for t in batch)
    stats = sampler.group_stats
    assert stats is not None and stats["zero_variance_groups"] > 0 and stats["resampled_groups"] > 0


def test_the_resampling_cap_holds_with_one_warning_and_an_empty_batch(untrained, tok):
    """Every group is flat: 2 resamplings, then the batch is returned as it is (empty: nothing differs)."""
    venv = _coins(2, flat_share=1.0)
    steps = []
    sampler = EpisodeSampler(venv, tok,
                             groups=GroupSampling(group_size=2, drop_zero_variance_groups=True, max_resample_rounds=2))
    with pytest.warns(UserWarning, match="dynamic sampling: after 2 resamplings only 0 of 3 groups") as caught:
        batch = sampler.collect(untrained, 6, generator=torch.Generator().manual_seed(0),
                                on_step=lambda d, i, r, rec: steps.append(len(d)) or True)
    assert batch == [] and len(caught) == 1
    # 3 groups (3 rounds of 2 envs), then twice 3 groups to replace them: 9 one-step rounds
    assert sampler.group_stats == dict(groups=9, zero_variance_groups=1.0, resampled_groups=6)
    assert sum(steps) == 9 * 2


def test_the_step_budget_ends_a_grouped_batch_without_a_warning(untrained, tok):
    sampler = EpisodeSampler(_coins(2, flat_share=1.0), tok,
                             groups=GroupSampling(group_size=2, drop_zero_variance_groups=True))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        batch = sampler.collect(untrained, 6, max_env_steps=4, generator=torch.Generator().manual_seed(0))
    assert batch == [] and sampler.group_stats is not None and sampler.group_stats["groups"] == 2


# ---------------------------------------------------------------------- groups reach the advantages
def test_the_buffer_passes_each_trajectorys_group_to_the_estimator(untrained, tok, monkeypatch):
    batch = EpisodeSampler(_coins(3), tok, groups=GroupSampling(group_size=3)).collect(
        untrained, 6, generator=torch.Generator().manual_seed(0))
    loose = EpisodeSampler(_coins(1), tok).collect(untrained, 2, generator=torch.Generator().manual_seed(0))
    seen = []

    def spy(advantage_batch, config):
        seen.append(advantage_batch.groups)
        return advantage_batch.rewards, None

    monkeypatch.setattr(buffers, "get_adv_estimator_fn", lambda name: spy)
    buffer = buffers.TokenRolloutBuffer(8, spaces.Text(8), spaces.Text(8), normalize_advantage=False)
    buffer.add(batch + loose)
    buffer.compute_returns_and_advantage()
    assert seen[0].tolist() == buffer.groups.tolist() == [0, 0, 0, 1, 1, 1, 2, 3]  # an ungrouped episode: alone
    assert group_index(loose).tolist() == [0, 1]


# ---------------------------------------------------------------------- the algorithms' settings and logs
class _GroupLog(BaseCallback):
    def __init__(self):
        super().__init__()
        self.logged: list[dict] = []

    def _on_step(self) -> bool:
        return True

    def _on_rollout_end(self) -> None:
        self.logged.append(dict(self.logger.name_to_value))


@pytest.mark.heavy
@pytest.mark.parametrize("algo", [Reinforce, TokenPPO])
def test_grouped_training_logs_the_group_statistics(tok, algo):
    model = algo("TinyAgentPolicy", _coins(2), base_agent=None, policy_kwargs=dict(tokenizer=tok), seed=0,
                 n_episodes=8, group_size=4, drop_zero_variance_groups=True, max_resample_rounds=8)
    log = _GroupLog()
    model.learn(24, callback=log)
    assert log.logged and all("rollout/zero_variance_groups" in x and "rollout/resampled_groups" in x
                              for x in log.logged)
    assert all(0 <= x["rollout/zero_variance_groups"] <= 1 for x in log.logged)
    assert model.sampler.group_size == 4 and model.sampler.drop_zero_variance_groups
    plain = algo("TinyAgentPolicy", _coins(2), base_agent=None, policy_kwargs=dict(tokenizer=tok), seed=0,
                 n_episodes=4)
    plain_log = _GroupLog()
    plain.learn(8, callback=plain_log)
    assert not any("rollout/zero_variance_groups" in x for x in plain_log.logged)  # no groups: no group keys


@pytest.mark.parametrize("settings, message", [
    (dict(group_size=0), "group_size must be a positive integer, got 0"),
    (dict(drop_zero_variance_groups=True), "drop_zero_variance_groups needs group_size >= 2"),
    (dict(group_size=2, fresh_batches=False), "group_size=2 plays fresh batches only"),
    (dict(group_size=2, async_envs=True), "group_size=2 plays groups in lockstep rounds"),
    (dict(group_size=2, max_resample_rounds=-1), "max_resample_rounds must be a non-negative integer"),
])
def test_group_settings_that_do_not_go_together_are_one_line_errors(tok, settings, message):
    with pytest.raises(ValueError, match=message) as e:
        Reinforce("TinyAgentPolicy", _coins(1), base_agent=None, policy_kwargs=dict(tokenizer=tok), **settings)
    assert "\n" not in str(e.value)


def test_the_sampler_says_what_groups_need(untrained, tok):
    with pytest.raises(ValueError, match="group_size=2 plays fresh batches only"):
        EpisodeSampler(_coins(1), tok, groups=GroupSampling(group_size=2)).collect(untrained, 2, fresh=False)
    with pytest.raises(ValueError, match="drop_zero_variance_groups needs group_size >= 2"):
        EpisodeSampler(_coins(1), tok, groups=GroupSampling(drop_zero_variance_groups=True))
