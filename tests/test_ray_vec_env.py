"""RayVecEnv steps like SB3's own vector envs (the ToolLatency wrapper's own tests are in test_text_wrappers.py).

One local Ray session (2 CPUs) is shared by the module's tests and shut down at the end.
"""

from __future__ import annotations

import functools
import subprocess
import sys

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.wrappers import OrderEnforcing
from stable_baselines3.common.vec_env import DummyVecEnv

import bugfix_gym
from bugfix_gym import BugFixEnv
from bugfix_gym.views.text_wrappers import ToolLatency
from bugfix_gym.views.wrappers import DiscreteCalls


#: every test here starts Ray actors (seconds each): make test-heavy, not make test
pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def ray():
    ray = pytest.importorskip("ray")
    from agents.rollout.ray_vec_env import init_ray

    init_ray(num_cpus=2)
    yield ray
    ray.shutdown()


def discrete_env_fns(n: int) -> list:
    """``n`` factories of the DiscreteCalls view. Local lambdas travel by value, so an actor
    does not import this module (and with it SB3 and torch) to rebuild them."""
    return [lambda: DiscreteCalls(gym.make("BugFix-v0"), max_len=128) for _ in range(n)]


def legal_calls(rng: np.random.Generator, masks: np.ndarray) -> np.ndarray:
    """One random legal call index per env, from each env's ``action_mask`` row."""
    return np.array([rng.choice(np.flatnonzero(row)) for row in masks])


def assert_same_obs(a, b) -> None:
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    else:
        np.testing.assert_array_equal(a, b)


def test_same_trajectories_as_dummy_vec_env_with_auto_reset_seeds_and_options(ray):
    from agents import RayVecEnv

    n_envs, n_steps = 3, 30
    vecs = [DummyVecEnv(discrete_env_fns(n_envs)), RayVecEnv(discrete_env_fns(n_envs))]
    for vec in vecs:
        vec.seed(7)
        vec.set_options([{}, {"task": "sum_to"}, {}])
    first = [vec.reset() for vec in vecs]
    assert_same_obs(*first)
    tasks = [[info["task_index"] for info in vec.reset_infos] for vec in vecs]  # the views' info is numbers only
    sum_to = [t.name for t in bugfix_gym.make_tasks("train")].index("sum_to")
    assert tasks[1] == tasks[0] and tasks[1][1] == sum_to

    rng = np.random.default_rng(0)
    obs, n_done, n_truncated = first[0], 0, 0
    for _ in range(n_steps):
        actions = legal_calls(rng, obs["action_mask"])
        (obs, rews, dones, infos), (r_obs, r_rews, r_dones, r_infos) = [vec.step(actions) for vec in vecs]
        assert_same_obs(obs, r_obs)
        np.testing.assert_array_equal(rews, r_rews)
        np.testing.assert_array_equal(dones, r_dones)
        for info, r_info in zip(infos, r_infos):
            assert r_info["task_index"] == info["task_index"] and r_info["last_call"] == info["last_call"]
            assert r_info["n_edits"] == info["n_edits"]
            assert r_info["TimeLimit.truncated"] == info["TimeLimit.truncated"]
            assert ("terminal_observation" in r_info) == ("terminal_observation" in info)
            if "terminal_observation" in info:
                assert_same_obs(info["terminal_observation"], r_info["terminal_observation"])
        assert [i["task_index"] for i in vecs[1].reset_infos] == [i["task_index"] for i in vecs[0].reset_infos]
        n_done += int(dones.sum())
        n_truncated += sum(info["TimeLimit.truncated"] for info in infos)
    assert n_done >= 5 and 0 < n_truncated < n_done  # both ends (submit, turn budget) were reset through

    # seeds and options were used once: a second reset draws new tasks in both, still alike
    assert_same_obs(*[vec.reset() for vec in vecs])
    for vec in vecs:
        vec.close()


def test_text_observations_and_string_actions_match_dummy_vec_env(ray):
    from agents import RayVecEnv

    make = functools.partial(gym.make, "BugFix-v0", max_turns=3)
    vecs = [DummyVecEnv([make, make]), RayVecEnv([make, make])]
    for vec in vecs:
        vec.seed(3)
    first = [vec.reset() for vec in vecs]
    assert first[1].dtype == object and first[1].shape == (2,) and all(isinstance(o, str) for o in first[1])
    assert first[1].tolist() == first[0].tolist()

    script = [["read", "test"], ["edit fix_init", "not a call"], ["submit", "read"], ["test", "submit"]]
    # env 0 submits on step 3; env 1 runs out of turns on step 3, then submits on its new episode's first turn
    for actions in script:
        (obs, rews, dones, infos), (r_obs, r_rews, r_dones, r_infos) = [vec.step(actions) for vec in vecs]
        assert r_obs.dtype == object and r_obs.shape == (2,)
        assert r_obs.tolist() == obs.tolist()
        np.testing.assert_array_equal(r_rews, rews)
        np.testing.assert_array_equal(r_dones, dones)
        assert [i.get("terminal_observation") for i in r_infos] == [i.get("terminal_observation") for i in infos]
    assert r_infos[1]["terminal_observation"].startswith("hidden tests")  # the episode's last tool output
    assert r_obs[1].startswith("fix the function")  # already the next episode's prompt
    for vec in vecs:
        vec.close()


def test_attributes_methods_and_wrapper_checks_reach_the_right_actor(ray):
    from agents import RayVecEnv

    vec = RayVecEnv([lambda: BugFixEnv(max_turns=3), lambda: gym.make("BugFix-v0", max_turns=5)])
    assert vec.get_attr("max_turns") == [3, 5]
    assert vec.get_attr("max_turns", indices=[1]) == [5]
    assert vec.has_attr("call_mask") and not vec.has_attr("no_such_attribute")
    assert vec.env_is_wrapped(OrderEnforcing) == [False, True]

    vec.seed(0)
    vec.reset()
    vec.set_attr("call_cost", 0.25, indices=0)  # on the bare env, so the reward sees it
    _, rews, _, _ = vec.step(["edit fix_init", "edit fix_init"])
    np.testing.assert_array_equal(rews, [-0.25, 0.0])
    replica = BugFixEnv(max_turns=3)  # env 0 as seeded by vec.seed(0), played in this process
    replica.reset(seed=0)
    replica.step("edit fix_init")
    np.testing.assert_array_equal(vec.env_method("call_mask", indices=[0])[0], replica.call_mask())
    assert vec.env_method("render_text", indices=1)[0].splitlines()[0] == "[turn 1/5]"

    with pytest.raises(ValueError, match="one action per env"):
        vec.step_async(["read"])
    actor = vec.actors[0]
    vec.close()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(actor.spaces.remote())


def test_an_actor_imports_no_env_package_by_itself():
    """The actor's module knows no BugFix: it imports the packages it is given, then makes the env
    (a plain id once the registering package is imported; a prefixed id imports it by itself)."""
    probe = ("import sys; import agents.rollout.env_actor as m; "
             "print(sorted(n for n in ('bugfix_gym', 'torch', 'stable_baselines3') if n in sys.modules)); "
             "actor = m.EnvActor(lambda: __import__('gymnasium').make('bugfix_gym:BugFix-v0', max_turns=2)); "
             "print(actor.get_attr('max_turns')); "
             "plain = m.EnvActor(lambda: __import__('gymnasium').make('LookThenAnswer-v0'), ['bugfix_gym']); "
             "print(type(plain.env.unwrapped).__name__)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:3] == ["[]", "2", "LookThenAnswerEnv"]


def test_the_actors_import_the_packages_that_registered_the_drivers_env_ids():
    from agents.rollout.env_actor import registering_packages

    packages = registering_packages()
    assert "bugfix_gym" in packages and "gymnasium" not in packages


def test_without_ray_the_error_says_what_to_install(monkeypatch):
    from agents.rollout.ray_vec_env import RayVecEnv

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'bugfix-gym\[ray\]'"):
        RayVecEnv(discrete_env_fns(1))


def test_asynchronous_sampling_gives_whole_on_policy_episodes_and_trains(ray, shared_base_agent, tok):
    """send / receive: each env steps as soon as its call is written. The episodes are still whole,
    their tokens still the policy's own (sample_logp = the trainer's recomputation), and TokenPPO
    trains on them."""
    import torch

    from agents import RayVecEnv, TokenPPO
    from agents.model.tinyagent import score_tokens
    from agents.rollout.sampler import EpisodeSampler
    from agents.rollout.trajectory import collate

    venv = RayVecEnv([lambda: ToolLatency(BugFixEnv(), 0.005) for _ in range(3)])
    try:
        trajs = EpisodeSampler(venv, tok, asynchronous=True).collect(shared_base_agent, 8,
                                                                     generator=torch.Generator().manual_seed(0))
        assert len(trajs) >= 8
        for tr in trajs:
            assert tr.owner[0] == 1 and tr.owner[-1] == 3 and tr.info["stop"] in ("submit", "budget")
        batch = collate(trajs)
        with torch.no_grad():
            logp, _, _ = score_tokens(shared_base_agent, batch["ids"])
        assert ((logp - batch["sample_logp"]) * batch["policy_mask"]).abs().max() < 1e-5
        model = TokenPPO("TinyAgentPolicy", venv, base_agent=shared_base_agent, n_episodes=6, n_minibatches=2,
                         async_envs=True, seed=0, critic_warmup_steps=2)
        model.learn(30)
        assert model.num_timesteps >= 30 and model._iteration >= 1
    finally:
        venv.close()
    with pytest.raises(ValueError, match="send"):
        EpisodeSampler(DummyVecEnv([lambda: BugFixEnv()]), tok, asynchronous=True)


def test_make_vec_env_builds_monitored_envs_in_actors_that_step_like_dummy_vec_env(ray):
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.monitor import Monitor

    from agents import RayVecEnv

    kw = dict(n_envs=2, seed=5, env_kwargs=dict(max_turns=3, render_mode=None))
    vecs = [make_vec_env("BugFix-v0", **kw), make_vec_env("BugFix-v0", vec_env_cls=RayVecEnv, **kw)]
    try:
        assert isinstance(vecs[1], RayVecEnv) and vecs[1].env_is_wrapped(Monitor) == [True, True]
        first = [vec.reset() for vec in vecs]
        assert first[1].dtype == object and first[1].tolist() == first[0].tolist()
        # env 0 submits on step 2; env 1 runs out of its 3 turns on step 3: Monitor reports both episodes
        for actions in (["read", "test"], ["submit", "edit fix_init"], ["read", "read"]):
            (obs, rews, dones, infos), (r_obs, r_rews, r_dones, r_infos) = [vec.step(actions) for vec in vecs]
            assert r_obs.tolist() == obs.tolist() and r_rews.tolist() == rews.tolist()
            assert r_dones.tolist() == dones.tolist()
            episodes = [[(i["episode"]["r"], i["episode"]["l"]) for i in step if "episode" in i]
                        for step in (infos, r_infos)]
            assert episodes[1] == episodes[0]
        assert [len(lengths) for lengths in vecs[1].env_method("get_episode_lengths")] == [1, 1]
        assert vecs[1].env_method("get_episode_lengths") == [[2], [3]]
    finally:
        for vec in vecs:
            vec.close()


JOIN = """
import sys
import ray
from agents import RayVecEnv
from bugfix_gym import BugFixEnv

vec = RayVecEnv([lambda: BugFixEnv(max_turns=3)], address=sys.argv[1])
obs = vec.reset()
obs, rewards, dones, infos = vec.step(["read"])
print(ray.get_runtime_context().gcs_address, obs[0].splitlines()[0])
vec.close()
"""


def test_address_joins_a_running_ray_session_from_another_process(ray):
    """A second process joins this module's Ray session by its address (``address="host:port"``, what
    ``"auto"`` resolves to after ``ray start --head``), and its env runs in an actor of that session."""
    from pathlib import Path

    address = ray.get_runtime_context().gcs_address
    out = subprocess.run([sys.executable, "-c", JOIN, address], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parent.parent)  # this checkout's packages
    assert out.returncode == 0, out.stderr[-2000:]
    joined, first_line = out.stdout.strip().splitlines()[-1].split(" ", 1)
    assert joined == address and first_line.startswith("def ")  # the `read` output: the function's source


def test_close_after_an_actor_died_closes_the_others_without_raising(ray):
    from agents import RayVecEnv

    vec = RayVecEnv([lambda: BugFixEnv(max_turns=3) for _ in range(3)])
    vec.reset()
    ray.kill(vec.actors[0])  # the actor dies (as after an out-of-memory kill)
    others = vec.actors[1:]
    vec.close()
    for actor in others:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.spaces.remote())
