"""The torch thread count the algorithms run the tiny model under (agents.model.threads)."""

from __future__ import annotations

import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.env_util import make_vec_env

import bugfix_gym
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.reinforce import Reinforce
from agents.model import threads


@pytest.fixture
def untouched_two_threads(monkeypatch):
    """torch at 2 threads, taken as torch's default (the user chose nothing), no thread env variable;
    the count before the test is put back afterwards."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    monkeypatch.setattr(threads, "_TORCH_DEFAULT", 2)
    for name in threads.THREAD_ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    yield
    torch.set_num_threads(before)


class ThreadsSeen(BaseCallback):
    """Records torch's thread count at every env step of ``learn``."""

    def __init__(self):
        super().__init__()
        self.seen: set[int] = set()

    def _on_step(self) -> bool:
        self.seen.add(torch.get_num_threads())
        return True


def test_auto_is_one_thread_unless_the_user_chose_a_count(untouched_two_threads, monkeypatch):
    assert threads.resolve_threads("auto") == 1
    assert threads.resolve_threads("auto", "cuda") is None
    assert threads.resolve_threads(None) is None and threads.resolve_threads(3) == 3
    torch.set_num_threads(3)  # the user's own count
    assert threads.resolve_threads("auto") is None
    torch.set_num_threads(2)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert threads.resolve_threads("auto") is None


def test_use_threads_puts_the_callers_count_back(untouched_two_threads):
    with threads.use_threads("auto"):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == 2
    with pytest.raises(RuntimeError):
        with threads.use_threads(1):
            raise RuntimeError("boom")
    assert torch.get_num_threads() == 2


@pytest.mark.parametrize("bad", [0, -1, "two", 1.5, True])
def test_a_bad_setting_is_a_one_line_error(bad):
    with pytest.raises(ValueError, match="torch_threads must be 'auto', None"):
        TokenPPO("TinyAgentPolicy", "BugFix-v0", base_agent=None, torch_threads=bad)


@pytest.mark.heavy
@pytest.mark.parametrize("algo", [TokenPPO, Reinforce])
@pytest.mark.parametrize("setting, inside", [("auto", 1), (None, 2), (2, 2)])
def test_learn_runs_under_the_setting_and_leaves_the_global_count(untouched_two_threads, shared_base_agent,
                                                                  algo, setting, inside):
    model = algo("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=2, seed=0), base_agent=shared_base_agent,
                 n_episodes=2, seed=0, torch_threads=setting)
    seen = ThreadsSeen()
    model.learn(8, callback=seen)
    assert seen.seen == {inside} and torch.get_num_threads() == 2


def test_a_count_the_user_set_is_kept(untouched_two_threads, shared_base_agent):
    torch.set_num_threads(3)
    model = TokenPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=2, seed=0), base_agent=shared_base_agent,
                     n_episodes=2, seed=0)
    seen = ThreadsSeen()
    model.learn(8, callback=seen)
    assert seen.seen == {3}


def test_predict_runs_under_the_policys_setting(untouched_two_threads, shared_base_agent, monkeypatch):
    model = TokenPPO("TinyAgentPolicy", "BugFix-v0", base_agent=shared_base_agent, seed=0)
    counts = []
    generate = model.policy.generate_calls
    monkeypatch.setattr(model.policy, "generate_calls",
                        lambda *a, **k: counts.append(torch.get_num_threads()) or generate(*a, **k))
    obs, _ = model.env.envs[0].reset(seed=0)
    model.predict(obs)
    assert counts == [1] and torch.get_num_threads() == 2


def test_tensorboard_runs_are_named_after_the_algorithm(tmp_path, shared_base_agent):
    model = Reinforce("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=2, seed=0), base_agent=shared_base_agent,
                      n_episodes=2, seed=0, tensorboard_log=str(tmp_path))
    model.learn(4)
    assert [p.name for p in tmp_path.iterdir()] == ["Reinforce_1"]


def test_the_bugfix_evaluator_plays_under_the_agents_setting(untouched_two_threads, shared_base_agent, monkeypatch):
    from agents.bugfix import evaluation
    from agents.rollout.sampler import EpisodeSampler

    counts = []
    play = EpisodeSampler.play_tasks
    monkeypatch.setattr(EpisodeSampler, "play_tasks",
                        lambda self, *a, **k: counts.append(torch.get_num_threads()) or play(self, *a, **k))
    evaluation.evaluate(shared_base_agent, ["clamp"], tokenizer=bugfix_gym.build_tokenizer())
    model = Reinforce("TinyAgentPolicy", "BugFix-v0", base_agent=shared_base_agent, torch_threads=None)
    evaluation.evaluate(model, ["clamp"])
    assert counts == [1, 2] and torch.get_num_threads() == 2
