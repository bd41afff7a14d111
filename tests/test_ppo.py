"""TokenPPO behind the SB3 interface: ratios, buffer GAE, save/load, callbacks, logging, guards, learning."""

from __future__ import annotations

import copy
import io
import zipfile

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.callbacks import BaseCallback, CheckpointCallback, EvalCallback
from stable_baselines3.common.logger import KVWriter, Logger

import bugfix_gym  # noqa: F401  (registers BugFix-v0)
from stable_baselines3.common.env_util import make_vec_env

from agents.algorithms.buffers import TokenRolloutBuffer
from agents.algorithms.callbacks import StopAfterIterations
from agents.bugfix.callbacks import KeepBest
from agents.bugfix.evaluation import evaluate, sample_episodes
from agents.algorithms.ppo import DivergenceError, TokenPPO
from agents.bugfix.aux_losses import ToolOutputLoss, aux_losses_from_settings
from agents.rollout.trajectory import Trajectory


@pytest.fixture(scope="module")
def base(shared_base_agent):
    return shared_base_agent


def vec(n=4, seed=0, **kw):
    return make_vec_env("BugFix-v0", n_envs=n, seed=seed, env_kwargs=kw or None)


def small(env=None, **kw) -> TokenPPO:
    """A fast TokenPPO from the base agent (small batches, 4 envs)."""
    args = dict(n_episodes=8, n_minibatches=2, n_epochs=2, seed=0, critic_warmup_steps=5, target_kl=None)
    args.update(kw)
    return TokenPPO("TinyAgentPolicy", env or vec(), **args)


class Capture(KVWriter):
    """An SB3 logger output that keeps every dumped key/value."""

    def __init__(self):
        self.rows: list[dict] = []

    def write(self, key_values, key_excluded, step=0):
        self.rows.append(dict(key_values))


# ---------------------------------------------------------------------- the PPO ratio
class RecordingPPO(TokenPPO):
    """Keeps the statistics of every minibatch, in order."""

    def _minibatch_loss(self, sample, clip_low, clip_high):
        loss, stats = super()._minibatch_loss(sample, clip_low, clip_high)
        self.seen = getattr(self, "seen", []) + [stats]
        return loss, stats


def test_first_minibatch_ratio_is_exactly_one(base):
    model = RecordingPPO("TinyAgentPolicy", vec(6), base_agent=base, n_episodes=12,
                         n_minibatches=3, n_epochs=2, seed=1, learning_rate=3e-3, critic_warmup_steps=0,
                         target_kl=None)
    trajs = model.sample_episodes(n=12)
    epochs = model.train_on_batch(trajs)
    first = model.seen[0]
    # pi_old is frozen once before the update, in the first epoch's minibatch layout: the first
    # minibatch repeats that computation, so its ratios are exactly 1, with zero KL and no clipping
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0
    assert first["approx_kl"] == 0.0 and first["clip_frac"] == 0.0
    # ... and later minibatches do move (old_logp is NOT recomputed inside the loop)
    assert max(s["ratio_max"] for s in model.seen[1:]) > 1 + 1e-3
    assert len(epochs) == 2


def test_sampler_logp_gives_ratio_one_too(base):
    model = RecordingPPO("TinyAgentPolicy", vec(), base_agent=base, n_episodes=8,
                         n_minibatches=1, n_epochs=1, seed=2, recompute_old_logp=False, critic_warmup_steps=0)
    model.train_on_batch(model.sample_episodes())
    # the KV-cache sampler and the trainer's full forward agree (book §8.6: within ~2e-6)
    assert abs(model.seen[0]["ratio_min"] - 1) < 1e-4 and abs(model.seen[0]["ratio_max"] - 1) < 1e-4


# ---------------------------------------------------------------------- the buffer uses GAE over policy tokens
def _traj(owner, token_rewards, reward):
    owner = torch.tensor(owner)
    T = len(owner)
    return Trajectory(ids=torch.arange(T) + 4, owner=owner, policy_mask=(owner[1:] == 2).float(),
                      sample_logp=torch.zeros(T - 1), values=torch.zeros(T - 1),
                      token_rewards=torch.tensor(token_rewards, dtype=torch.float32), reward=reward,
                      info={}, task="t")


def test_buffer_gae_skips_tool_tokens_by_hand():
    obs_space = gym.spaces.Text(8)
    buf = TokenRolloutBuffer(2, obs_space, obs_space, gamma=1.0, gae_lambda=0.5)
    # prompt, call [2 tokens], tool [2 tokens], call [1 token]: policy targets at t = 1, 2, 5
    a = _traj([1, 1, 2, 2, 3, 3, 2], [0, 0, 0, 0, 0, 1.0], 1.0)
    b = _traj([1, 1, 2, 2, 3, 3, 2], [0, 0, 0, 0, 0, 0.0], 0.0)
    buf.add([a, b])
    values = torch.tensor([[9.0, 0.2, 0.4, 9.0, 9.0, 0.6]] * 2)  # 9s sit on prompt/tool positions
    buf.set_old_policy(torch.zeros(2, 6), values)
    buf.compute_returns_and_advantage()
    # worked by hand (gamma 1, lambda 0.5), row a:
    # t=5: delta = 1 - 0.6 = 0.4, A = 0.4; t=4,3 tool: carried; t=2: delta = 0.6 - 0.4 = 0.2,
    # A = 0.2 + 0.5 * 0.4 = 0.4; t=1: delta = 0.4 - 0.2 = 0.2, A = 0.2 + 0.5 * 0.4 = 0.4
    torch.testing.assert_close(buf.raw_advantages[0], torch.tensor([0, 0.4, 0.4, 0, 0, 0.4]))
    torch.testing.assert_close(buf.returns[0], torch.tensor([0, 0.6, 0.8, 0, 0, 1.0]))
    # row b (no reward): t=5: -0.6; t=2: 0.2 - 0.3 = -0.1; t=1: 0.2 - 0.05 = 0.15
    torch.testing.assert_close(buf.raw_advantages[1], torch.tensor([0, 0.15, -0.1, 0, 0, -0.6]))
    # whitened over all policy tokens of the batch
    m = buf.policy_mask > 0
    assert abs(float(buf.advantages[m].mean())) < 1e-6 and abs(float(buf.advantages[m].std()) - 1) < 1e-5
    # values at tool / prompt positions never change the advantages
    buf.set_old_policy(torch.zeros(2, 6), values.masked_fill(~m, -123.0))
    before = buf.raw_advantages.clone()
    buf.compute_returns_and_advantage()
    torch.testing.assert_close(buf.raw_advantages, before)
    # minibatches are whole trajectories trimmed to their own length
    samples = list(buf.get(1))
    assert len(samples) == 2 and samples[0].ids.shape == (1, 7) and samples[0].policy_mask.shape == (1, 6)


# ---------------------------------------------------------------------- save / load
def test_save_load_identical_predictions(tmp_path, base):
    env = vec()
    model = small(env, base_agent=base)
    model.learn(40)
    path = tmp_path / "model.zip"
    model.save(path)
    loaded = TokenPPO.load(path, env=env)
    for (k, v), (k2, v2) in zip(model.policy.state_dict().items(), loaded.policy.state_dict().items()):
        assert k == k2 and torch.equal(v, v2)
    for a, b in zip(model.policy.optimizer.state_dict()["state"].values(),
                    loaded.policy.optimizer.state_dict()["state"].values()):
        assert torch.equal(a["exp_avg"], b["exp_avg"])
    assert loaded.policy.tokenizer == model.policy.tokenizer
    assert loaded.saved_arguments() == model.saved_arguments()
    assert loaded.num_timesteps == model.num_timesteps and loaded._n_updates == model._n_updates
    obs, _ = gym.make("BugFix-v0").reset(seed=3)
    assert model.predict(obs, deterministic=True)[0] == loaded.predict(obs, deterministic=True)[0]
    torch.manual_seed(0)
    a = model.predict([obs] * 5)[0]
    torch.manual_seed(0)
    b = loaded.predict([obs] * 5)[0]
    assert list(a) == list(b)
    loaded.learn(20)  # the loaded model keeps training
    with zipfile.ZipFile(path) as z:  # SB3's layout, nothing pickled in data
        assert {"data", "policy.pth", "policy.optimizer.pth"} <= set(z.namelist())
        assert ":serialized:" not in z.read("data").decode()


def test_corrupt_foreign_and_missing_files_are_one_line_errors(tmp_path):
    junk = tmp_path / "junk.zip"
    junk.write_bytes(b"not a zip at all" * 10)
    with pytest.raises(ValueError, match="not a bugfix-gym model file") as e:
        TokenPPO.load(junk)
    assert "\n" not in str(e.value)
    foreign = tmp_path / "foreign.zip"
    with zipfile.ZipFile(foreign, "w") as z:  # an SB3 zip from another algorithm
        z.writestr("data", '{"policy_class": {":type:": "<class>", ":serialized:": "gASV"}}')
        z.writestr("policy.pth", b"")
    with pytest.raises(ValueError, match="refusing to unpickle") as e:
        TokenPPO.load(foreign)
    assert "\n" not in str(e.value)
    with pytest.raises(FileNotFoundError):
        TokenPPO.load(tmp_path / "missing.zip")


def test_truncated_checkpoint_is_a_clear_error(tmp_path, base):
    model = small(base_agent=base)
    buf = io.BytesIO()
    model.save(buf)
    cut = tmp_path / "cut.zip"
    cut.write_bytes(buf.getvalue()[: len(buf.getvalue()) // 2])
    with pytest.raises(ValueError, match="model file") as e:
        TokenPPO.load(cut)
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------------- the env it is given
def test_eval_callback_and_evaluate_policy_on_a_plain_gym_make(tmp_path, base):
    from stable_baselines3.common.evaluation import evaluate_policy

    model = small(base_agent=base)
    eval_cb = EvalCallback(gym.make("BugFix-v0", split="heldout"), n_eval_episodes=3, eval_freq=10,
                           log_path=str(tmp_path), verbose=0)
    ckpt_cb = CheckpointCallback(save_freq=5, save_path=str(tmp_path), name_prefix="tp")
    model.learn(60, callback=[eval_cb, ckpt_cb], progress_bar=True)
    assert len(eval_cb.evaluations_results) >= 1 and len(eval_cb.evaluations_results[0]) == 3
    assert (tmp_path / "evaluations.npz").exists()
    files = sorted(tmp_path.glob("tp_*_steps.zip"))
    assert files, "CheckpointCallback saved nothing"
    TokenPPO.load(files[-1])
    rewards, lengths = evaluate_policy(model, gym.make("BugFix-v0"), n_eval_episodes=4, return_episode_rewards=True)
    assert len(rewards) == 4 and all(1 <= n <= 6 for n in lengths) and set(rewards) <= {0.0, 1.0}


def test_monitor_statistics_are_the_real_episodes_and_timesteps_stop_at_the_total(base):
    model = small(vec(3), base_agent=base, n_episodes=8)  # n_envs independent of n_episodes
    model.learn(90)
    assert model.num_timesteps == 90  # 30 steps of 3 envs: no overshoot past total_timesteps
    lengths = [int(e["l"]) for e in model.ep_info_buffer]
    returns = [float(e["r"]) for e in model.ep_info_buffer]
    assert lengths and all(1 <= n <= 6 for n in lengths) and set(returns) <= {0.0, 1.0}
    assert sum(len(m.get_episode_rewards()) for m in model.env.envs) >= len(lengths)


@pytest.mark.heavy
def test_timesteps_and_the_progress_bar_stop_at_the_first_multiple_of_n_envs_past_the_total(base):
    """Every vector step counts n_envs env steps (as in SB3), so 3 envs and learn(91) stop at 93 = 31 * 3:
    past the total by less than n_envs, and the progress bar reads 93/91."""
    from stable_baselines3.common.callbacks import ProgressBarCallback

    model = small(vec(3), base_agent=base, n_episodes=8)
    bar = ProgressBarCallback()
    model.learn(91, callback=bar)
    assert model.num_timesteps == 93 and model._total_timesteps == 91
    assert (bar.pbar.n, bar.pbar.total) == (93, 91)
    model.learn(91, callback=bar, reset_num_timesteps=False)  # 91 more after the 93 done: to 186 = 62 * 3
    assert model.num_timesteps == 186 and (bar.pbar.n, bar.pbar.total) == (186 - 93, 184 - 93)


class FillerMarked(TokenPPO):
    """Waiting envs get a call the policy can never write, so a Monitor episode made of it shows."""

    def _make_sampler(self, env):
        sampler = super()._make_sampler(env)
        if sampler is not None:
            sampler.filler = "#filler#"
        return sampler


@pytest.mark.heavy
def test_every_monitor_episode_is_played_by_the_policy_and_num_timesteps_counts_every_env_step(base):
    """Fresh batches with more episodes than envs (3 envs record 3 episodes each per iteration): an env
    that has its episodes must not play a filler episode that Monitor reports as an episode of the run,
    so Monitor's episodes are exactly the trainer's; num_timesteps counts every env step taken, filler
    calls included, as SB3's does (Monitor's total steps)."""
    env = make_vec_env("BugFix-v0", n_envs=3, seed=0, monitor_kwargs=dict(info_keywords=("actions",)))
    model = FillerMarked("TinyAgentPolicy", env, base_agent=base, n_episodes=8, n_minibatches=2, n_epochs=1,
                         seed=0, critic_warmup_steps=0, target_kl=None)
    assert not any("#filler#" in word for word in model.policy.tokenizer.words)
    reported, recorded = [], []

    class Episodes(BaseCallback):
        def _on_step(self):
            reported.extend(info["episode"] for info in self.locals["infos"] if "episode" in info)
            return True

        def _on_rollout_end(self):
            recorded.extend(self.locals["trajectories"])

    model.learn(200, callback=Episodes())
    assert len(reported) == sum(len(m.get_episode_rewards()) for m in env.envs) and len(recorded) >= 18
    filler = [e["actions"] for e in reported if "#filler#" in e["actions"]]
    assert filler == []
    assert sorted((round(e["r"], 6), e["l"]) for e in reported) == \
        sorted((round(tr.reward, 6), tr.info["n_turns"]) for tr in recorded)
    assert model.num_timesteps == sum(m.get_total_steps() for m in env.envs) > sum(e["l"] for e in reported)


class RewardTestCalls(gym.Wrapper):
    """A user's reward shaping: +1 for every `test` call, and nothing else."""

    def step(self, action):
        obs, _, terminated, truncated, info = self.env.step(action)
        return obs, float(action.split() == ["test"]), terminated, truncated, info


@pytest.mark.heavy
def test_tokenppo_learns_the_reward_of_the_wrapped_env(base):
    env = make_vec_env("BugFix-v0", n_envs=16, seed=0, wrapper_class=RewardTestCalls)
    model = TokenPPO("TinyAgentPolicy", env, base_agent=base, n_episodes=32, seed=0, critic_warmup_steps=10)

    def tests_per_episode(trajs):
        return float(np.mean([sum(a.split() == ["test"] for a in t.info["actions"]) for t in trajs]))

    before = tests_per_episode(model.sample_episodes(n=64))
    model.learn(2000)
    after = tests_per_episode(model.sample_episodes(n=64))
    assert after >= before + 2.0, (before, after)  # the wrapper's reward, not the env's, was learned


@pytest.mark.heavy
def test_subproc_vec_env_trains_like_dummy_vec_env(base):
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    def run(cls):
        env = make_vec_env("BugFix-v0", n_envs=2, seed=3, vec_env_cls=cls)
        model = small(env, base_agent=base, seed=3)
        model.learn(40)
        env.close()
        return model

    a, b = run(DummyVecEnv), run(SubprocVecEnv)
    assert a.num_timesteps == b.num_timesteps
    for (k, v), (_, w) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(v, w), k


# ---------------------------------------------------------------------- SB3 logging
def test_learn_returns_self_and_logs_sb3_keys(base):
    model = small(base_agent=base)
    cap = Capture()
    model.set_logger(Logger(folder=None, output_formats=[cap]))
    assert model.learn(120) is model
    keys = set().union(*cap.rows)
    advertised = gym.make("BugFix-v0").metadata["agent_defaults"]["logged_stats"]
    assert {f"rollout/{key}" for key in ("reward", "turns", *advertised)} <= keys  # the env's keys and the return
    for key in ("rollout/pass_rate", "rollout/ep_rew_mean", "rollout/ep_len_mean", "rollout/policy_tokens",
                "time/fps", "train/clip_fraction", "train/approx_kl", "train/ratio_min", "train/ratio_max",
                "train/entropy_loss", "train/explained_variance", "train/value_loss",
                "train/policy_gradient_loss", "train/epochs_run", "train/n_updates", "train/grad_steps"):
        assert key in keys, key
    assert model.num_timesteps == 120
    diag = model.diagnostics[-1]
    assert len(diag["epochs"]) == 2 and {"clip_frac", "approx_kl", "ratio_min"} <= set(diag["epochs"][0])
    # SB3 counts epochs in train/n_updates (PPO: n_epochs per iteration), not gradient steps
    assert model._n_updates == sum(d["epochs_run"] for d in model.diagnostics)
    assert model._n_updates < sum(d["grad_steps"] for d in model.diagnostics)


# ---------------------------------------------------------------------- guards
def test_nan_loss_stops_training_and_keeps_last_good_parameters(base):
    model = small(base_agent=base)
    model.learn(20)  # one good iteration
    good = {k: v.clone() for k, v in model.policy.state_dict().items()}
    calls = {"n": 0}
    original = model._minibatch_loss

    def poisoned(sample, lo, hi):
        loss, stats = original(sample, lo, hi)
        calls["n"] += 1
        return (loss * float("nan"), stats) if calls["n"] == 2 else (loss, stats)  # a step happened before

    model._minibatch_loss = poisoned
    with pytest.raises(DivergenceError, match="non-finite loss") as e:
        model.learn(40, reset_num_timesteps=False)
    assert "\n" not in str(e.value) and isinstance(e.value, FloatingPointError)
    for k, v in model.policy.state_dict().items():
        assert torch.equal(v, good[k]), k


def test_target_kl_early_stop_reduces_epochs(base):
    def make(**kw):
        kw.setdefault("target_kl", None)
        return TokenPPO("TinyAgentPolicy", vec(), base_agent=base, n_episodes=16, n_epochs=4,
                        n_minibatches=2, seed=4, learning_rate=3e-3, critic_warmup_steps=0, **kw)

    def run(**kw):
        model = make(**kw)
        return model, model.train_on_batch(trajs)

    trajs = make().sample_episodes(n=16)
    _, full = run()
    _, by_epoch = run(target_kl=1e-6, target_kl_mode="epoch")
    model, by_mb = run(target_kl=1e-6, target_kl_mode="minibatch")
    assert len(full) == 4 and len(by_epoch) == 1 and len(by_mb) == 1
    assert by_mb[0]["minibatches"] == 1  # SB3's rule stops before the first step above 1.5 * target
    assert model.diagnostics[-1]["epochs_run"] == 1 and model.diagnostics[-1]["grad_steps"] == 1


@pytest.mark.parametrize("kwargs, match", [
    (dict(loss_mode="mean"), "loss_mode"), (dict(loss_mode="constant"), "needs loss_norm_const"),
    (dict(dual_clip=0.5), "dual_clip"), (dict(learning_rate=float("nan")), "learning_rate"),
    (dict(learning_rate=-1e-3), "learning_rate"), (dict(gae_lambda=5.0), "gae_lambda"),
    (dict(target_kl=-1.0), "target_kl"), (dict(n_episodes=0), "n_episodes"), (dict(n_epochs=1.5), "n_epochs"),
])
def test_bad_arguments_are_clear_errors(kwargs, match):
    with pytest.raises(ValueError, match=match) as e:
        TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=None, **kwargs)
    assert "\n" not in str(e.value)


def test_unknown_policy_is_a_clear_error():
    with pytest.raises(ValueError, match="Policy Mlp"):
        TokenPPO("MlpPolicy", gym.make("BugFix-v0"), base_agent=None)


# ---------------------------------------------------------------------- learning
@pytest.mark.slow
def test_short_training_run_improves_pass_rate(base):
    model = TokenPPO("TinyAgentPolicy", vec(32), base_agent=base, n_episodes=64, seed=0)
    probe = [t.name for t in bugfix_gym.make_tasks("train")] * 4  # 80 episodes, every train task

    def pass_rate():
        trajs = sample_episodes(model, probe, seed=123)
        return float(np.mean([bool(t.info["submitted"] and t.info["hidden_pass"]) for t in trajs]))

    before = pass_rate()
    model.learn(4000)  # from the clean base agent (this test alone): 0.175 -> 0.26 after 2000 steps, 0.46 after 4000
    after = pass_rate()
    assert after >= before + 0.15, (before, after)


# ---------------------------------------------------------------------- predict
def test_predict_threads_text_history_in_state(base):
    from stable_baselines3.common.vec_env import DummyVecEnv

    from bugfix_gym import OWNER_POLICY, episode_tokens

    model = small(base_agent=base)
    venv = DummyVecEnv([lambda: gym.make("BugFix-v0")])
    obs = venv.reset()
    state, start, done = None, np.ones(1, dtype=bool), False
    env = venv.envs[0].unwrapped
    while not done:
        action, state = model.predict(obs, state=state, episode_start=start, deterministic=True)
        assert isinstance(action[0], str)
        transcript = list(env.transcript)
        obs, _, dones, _ = venv.step(action)
        done, start = bool(dones[0]), dones
    # the history predict kept is exactly the episode's token view (prompt, calls with <eoc>, tool outputs)
    ids, _ = episode_tokens(transcript + [(OWNER_POLICY, action[0])], model.policy.tokenizer)
    assert state[0][0] == ids.tolist()


def test_predict_on_the_token_view(base):
    from bugfix_gym.views.wrappers import TokenObservation

    model = small(base_agent=base)
    env = TokenObservation(gym.make("BugFix-v0"))
    obs, _ = env.reset(seed=0)
    ids, state = model.predict(obs, deterministic=True)
    assert ids.shape == (model.policy.max_call_tokens,) and ids.dtype == np.int64 and state is None
    text_env = gym.make("BugFix-v0")
    text_obs, _ = text_env.reset(seed=0)  # same task, same prompt: the same call
    assert model.policy.tokenizer.decode(ids) == model.predict(text_obs, deterministic=True)[0]


def test_same_seed_same_training(base):
    def run():
        model = small(base_agent=base, seed=7)
        model.learn(30)
        return model

    a, b = run(), run()
    assert a.num_timesteps == b.num_timesteps
    for (k, v), (_, w) in zip(a.policy.state_dict().items(), b.policy.state_dict().items()):
        assert torch.equal(v, w), k


def test_keep_best_puts_back_the_weights_of_the_best_validation_score(base):
    model = small(base_agent=base)
    scores = iter([0.2, 0.9, 0.4, 0.1])  # iterations 0, 2, 4 and the end (after 5 updates)
    seen = {}

    def fake_evaluate(agent, tasks, episodes_per_task=1, seed=0, env_kwargs=None):
        seen[keep.iteration] = copy.deepcopy(agent.policy.state_dict())
        return {"pass_rate": next(scores)}

    keep = KeepBest(["count_above"], every=2, evaluate=fake_evaluate)
    model.learn(10**9, callback=[StopAfterIterations(5), keep])
    assert keep.history == [(0, 0.2), (2, 0.9), (4, 0.4), (5, 0.1)]
    assert (keep.best_iteration, keep.best_pass_rate) == (2, 0.9)
    final = model.policy.state_dict()
    assert all(torch.equal(final[k], seen[2][k]) for k in final)
    assert not all(torch.equal(final[k], seen[5][k]) for k in final)


def test_keep_best_with_average_last_puts_back_the_mean_of_the_latest_evaluated_weights(base):
    model = small(base_agent=base)
    scores = iter([0.2, 0.9, 0.4, 0.1, 0.7])  # iterations 0, 2, 4, the end (5), then the mean
    seen = {}

    def fake_evaluate(agent, tasks, episodes_per_task=1, seed=0, env_kwargs=None):
        seen[len(seen)] = copy.deepcopy(agent.policy.state_dict())
        return {"pass_rate": next(scores)}

    keep = KeepBest(["count_above"], every=2, average_last=0.5, evaluate=fake_evaluate)
    model.learn(10**9, callback=[StopAfterIterations(5), keep])
    assert keep.history == [(0, 0.2), (2, 0.9), (4, 0.4), (5, 0.1)]
    assert keep.averaged_iterations == [4, 5] and keep.average_pass_rate == 0.7
    final = model.policy.state_dict()
    for k in final:  # the mean of the weights evaluated at iterations 4 and 5, and those are what was evaluated last
        assert torch.allclose(final[k], (seen[2][k] + seen[3][k]) / 2, atol=1e-7), k
        assert torch.equal(final[k], seen[4][k]), k
    assert not all(torch.equal(seen[2][k], seen[3][k]) for k in final)  # two different weights were averaged


def test_keep_best_counts_iterations_from_the_updates_a_resumed_model_has_done(base, tmp_path):
    model = small(base_agent=base)
    model._iteration = 6  # as after restoring a run stopped at iteration 6
    keep = KeepBest(["count_above"], every=2, save_dir=tmp_path / "evaluated",
                    evaluate=lambda *a, **k: {"pass_rate": 0.5})
    model.learn(10**9, callback=[StopAfterIterations(3), keep])
    assert [it for it, _ in keep.history] == [6, 8, 9]
    assert sorted(p.name for p in (tmp_path / "evaluated").iterdir()) == [
        "iteration-0006.zip", "iteration-0008.zip", "iteration-0009.zip"]


@pytest.mark.parametrize("share", [0.0, -0.5, 1.5])
def test_keep_best_refuses_an_average_share_outside_0_1(share):
    with pytest.raises(ValueError, match="average_last must be in"):
        KeepBest(["count_above"], average_last=share, evaluate=evaluate)


# ---------------------------------------------------------------------- the auxiliary tool-output loss
def _edit_output_nll(model: TokenPPO, trajs: list[Trajectory]) -> float:
    from agents.algorithms.losses import tool_output_mask
    from agents.model.tinyagent import sequence_log_probs
    from agents.rollout.trajectory import collate

    data = collate(trajs, model.policy.tokenizer.pad_id)
    mask = tool_output_mask(data["ids"], data["owner"], [model.policy.tokenizer.ids["edit"]])  # [N, T-1]
    with torch.no_grad():
        return -float((sequence_log_probs(model.policy.model, data["ids"]) * mask).sum() / mask.sum())


def test_tool_coef_keeps_the_first_ratio_one_and_learns_what_the_edits_answered(base):
    """The auxiliary loss scores tool outputs in the same pass; the policy tokens' scores are unchanged."""
    kw = dict(base_agent=base, n_episodes=12, n_minibatches=3, n_epochs=4, seed=1, learning_rate=3e-3,
              critic_warmup_steps=0, target_kl=None)
    plain = RecordingPPO("TinyAgentPolicy", vec(6), **kw)
    aux = RecordingPPO("TinyAgentPolicy", vec(6), aux_losses=[ToolOutputLoss(1.0, ["edit"])], **kw)
    trajs = plain.sample_episodes(n=12)
    before = _edit_output_nll(plain, trajs)
    plain.train_on_batch(trajs)
    aux.train_on_batch(trajs)
    first = aux.seen[0]
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0 and first["approx_kl"] == 0.0
    assert first["pg_loss"] == plain.seen[0]["pg_loss"]  # the same policy-token scores as without it
    assert first["tool_loss"] > 1.0 and "tool_loss" not in plain.seen[0]  # the base agent never learnt them
    assert _edit_output_nll(aux, trajs) < 0.8 * min(before, _edit_output_nll(plain, trajs))


def test_edit_practice_adds_a_loss_on_practice_answers_and_leaves_the_policy_terms_alone(base):
    kw = dict(base_agent=base, n_episodes=12, n_minibatches=3, n_epochs=2, seed=1, learning_rate=3e-3,
              critic_warmup_steps=0, target_kl=None)
    plain = RecordingPPO("TinyAgentPolicy", vec(6), aux_losses=aux_losses_from_settings(1.0, ["edit"]), **kw)
    drilled = RecordingPPO("TinyAgentPolicy", vec(6), aux_losses=aux_losses_from_settings(1.0, ["edit"], 30), **kw)
    trajs = plain.sample_episodes(n=12)
    plain.train_on_batch(trajs)
    drilled.train_on_batch(trajs)
    first = drilled.seen[0]
    assert first["ratio_min"] == 1.0 and first["ratio_max"] == 1.0
    assert first["pg_loss"] == plain.seen[0]["pg_loss"] and first["tool_loss"] == plain.seen[0]["tool_loss"]
    assert first["practice_loss"] > 0.0 and "practice_loss" not in plain.seen[0]
    assert len(drilled.auxiliary_losses[1].practice()) == 30
    buf = io.BytesIO()
    drilled.save(buf)
    buf.seek(0)
    loaded = RecordingPPO.load(buf)
    assert [aux.spec() for aux in loaded.auxiliary_losses] == [aux.spec() for aux in drilled.auxiliary_losses]
    assert loaded.auxiliary_losses[1].n == 30 and loaded.auxiliary_losses[1].weight == 1.0


@pytest.mark.parametrize("kw, match", [(dict(tool_coef=-0.1), "tool_coef"), (dict(tool_coef=float("nan")), "tool_coef"),
                                       (dict(tool_calls=["edit", "look"]), "tool_calls"),
                                       (dict(tool_calls="edit"), "tool_calls"),
                                       (dict(practice=10), "practice needs tool_coef"),
                                       (dict(practice=-1, tool_coef=1.0), "practice must be")])
def test_bad_tool_loss_settings_are_one_line_errors(kw, match):
    from agents.bugfix.recipes import ppo_kwargs

    with pytest.raises(ValueError, match=match):
        TokenPPO("TinyAgentPolicy", vec(2), **ppo_kwargs(kw))
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{next(iter(kw))}'"):  # not TokenPPO's
        TokenPPO("TinyAgentPolicy", vec(2), base_agent=None, **kw)


# ---------------------------------------------------------------------- one definition per setting
def test_every_setting_is_read_from_the_one_config_object():
    """The settings live in the config object only: ``config=`` or keyword sugar build the same object, the
    algorithm keeps no copy of them as attributes, the saved settings are the config's saved fields."""
    import dataclasses

    from agents.algorithms.config import PPOConfig, ReinforceConfig
    from agents.algorithms.reinforce import Reinforce

    env = gym.make("BugFix-v0")
    sugar = TokenPPO("TinyAgentPolicy", env, base_agent=None, clip_range_high=0.28, n_epochs=3)
    given = TokenPPO("TinyAgentPolicy", env, base_agent=None, config=PPOConfig(clip_range_high=0.28, n_epochs=3))
    assert sugar.config == given.config == PPOConfig(clip_range_high=0.28, n_epochs=3)
    assert (sugar.config.clip_range_high, sugar.config.n_epochs, sugar.config.kl_estimator) == (0.28, 3, "k3")
    assert not any(hasattr(sugar, f.name) for f in dataclasses.fields(PPOConfig)
                   if f.name not in ("learning_rate", "gamma", "gae_lambda", "ent_coef", "vf_coef", "max_grad_norm"))
    mixed = TokenPPO("TinyAgentPolicy", env, base_agent=None, config=PPOConfig(n_epochs=3), n_epochs=5)
    assert mixed.config.n_epochs == 5 and mixed.config.clip_range_high is None  # a keyword replaces a field
    settings = sugar.saved_settings()
    assert list(settings) == list(PPOConfig.saved_names()) and settings["n_epochs"] == 3
    assert "async_envs" not in settings
    assert Reinforce.config_class().learning_rate == 2e-3 and PPOConfig().learning_rate == 1e-3
    with pytest.raises(TypeError, match="TokenPPO\\(\\) got an unexpected keyword argument 'clip_rang'") as e:
        TokenPPO("TinyAgentPolicy", env, base_agent=None, clip_rang=0.1)
    assert "\n" not in str(e.value)
    with pytest.raises(TypeError, match="takes a ReinforceConfig, got PPOConfig"):
        Reinforce("TinyAgentPolicy", env, base_agent=None, config=PPOConfig())
    with pytest.raises(ValueError, match="n_epochs must be a positive integer"):
        TokenPPO("TinyAgentPolicy", env, base_agent=None, config=PPOConfig(), n_epochs=0)
    assert ReinforceConfig().max_call_tokens == PPOConfig().max_call_tokens


def test_a_setting_becomes_a_command_line_flag_with_its_type_default_help_and_choices(capsys):
    import argparse

    from agents.algorithms.config import PPOConfig, argparse_kwargs

    parser = argparse.ArgumentParser(prog="train")
    for name in ("n_epochs", "clip_range_high", "loss_mode", "normalize_advantage", "learning_rate"):
        parser.add_argument("--" + name.replace("_", "-"), **argparse_kwargs(PPOConfig, name))
    args = parser.parse_args(["--n-epochs", "3", "--clip-range-high", "none", "--loss-mode", "seq_mean_token_sum",
                              "--normalize-advantage", "false", "--learning-rate", "3e-4"])
    assert (args.n_epochs, args.clip_range_high, args.loss_mode, args.normalize_advantage, args.learning_rate) == \
        (3, None, "seq_mean_token_sum", False, 3e-4)
    assert parser.parse_args([]).n_epochs == 4
    assert parser.parse_args(["--clip-range-high", "0.3"]).clip_range_high == 0.3
    assert argparse_kwargs(PPOConfig, "kl_estimator")["choices"] == ("k1", "k2", "k3")
    assert argparse_kwargs(PPOConfig, "n_epochs")["help"] == "passes over each batch"
    with pytest.raises(ValueError, match="aux_losses .* is not a command-line setting"):
        argparse_kwargs(PPOConfig, "aux_losses")
    with pytest.raises(SystemExit):
        parser.parse_args(["--loss-mode", "mean"])
    assert "invalid choice: 'mean'" in capsys.readouterr().err


# ---------------------------------------------------------------------- the algorithm layer knows no BugFix
def test_model_files_saved_by_main_4e10e0a_load_and_act_as_they_did():
    """TokenPPO's file was saved with tool_coef=0.5, tool_calls=["edit"], practice=2, practice_tasks="book":
    those settings load as the auxiliary losses they were."""
    import json
    from pathlib import Path

    from agents.algorithms.reinforce import Reinforce
    from agents.bugfix.aux_losses import EditPracticeLoss

    fixtures = Path(__file__).parent / "fixtures"
    expected = json.loads((fixtures / "main_4e10e0a_expected.json").read_text())
    for name, cls in (("tokenppo", TokenPPO), ("reinforce", Reinforce)):
        model = cls.load(fixtures / f"{name}_main_4e10e0a.zip")
        obs, _ = gym.make("BugFix-v0").reset(seed=3)
        action, _ = model.predict(obs, deterministic=True)
        assert str(action) == expected[name]["action"], name
        assert (model.num_timesteps, model._n_updates) == (expected[name]["num_timesteps"], expected[name]["n_updates"])
    ppo = TokenPPO.load(fixtures / "tokenppo_main_4e10e0a.zip")
    tool, practice = ppo.auxiliary_losses
    assert isinstance(tool, ToolOutputLoss) and (tool.weight, tool.calls) == (0.5, ["edit"])
    assert isinstance(practice, EditPracticeLoss) and (practice.weight, practice.n, practice.tasks) == (0.5, 2, "book")
    assert not any(hasattr(ppo, name) for name in ("tool_coef", "tool_calls", "practice", "practice_tasks"))


def test_the_env_advertises_the_tokenizer_and_base_agent_an_algorithm_defaults_to(shared_base_agent):
    """BugFix-v0 names its tokenizer and base agent (entry points in its metadata); an env that names
    none gets random weights, and without a tokenizer a character-level one of its Text spaces' charset."""
    from bugfix_gym import build_tokenizer

    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"))
    assert model.policy.tokenizer.to_dict() == build_tokenizer().to_dict()
    for ours, cached in zip(model.policy.model.state_dict().values(), shared_base_agent.state_dict().values()):
        assert torch.equal(ours, cached)
    look = gym.make("LookThenAnswer-v0")
    tok = bugfix_gym.Tokenizer(look.unwrapped.words)
    config = dict(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=64)
    seeded = [TokenPPO("TinyAgentPolicy", look, seed=0, policy_kwargs=dict(tokenizer=tok, model_config=config),
                       base_agent=base_agent) for base_agent in ("auto", None)]
    for a, b in zip(*(m.policy.model.state_dict().values() for m in seeded)):
        assert torch.equal(a, b)  # "auto" on an env without a base agent: the random init of None
    with pytest.warns(UserWarning, match="advertises no tokenizer: using a character-level one") as said:
        chars = TokenPPO("TinyAgentPolicy", look, base_agent=None)  # no tokenizer given, none advertised
    assert sum("character-level" in str(w.message) for w in said) == 1 and "\n" not in str(said[0].message)
    obs, _ = look.reset(seed=0)
    assert chars.policy.tokenizer.decode(chars.policy.tokenizer.encode(obs)) == obs


def test_aux_loss_specs_rebuild_the_losses_and_bad_ones_are_one_line_errors():
    from agents.algorithms.auxiliary import build_aux_losses

    losses = aux_losses_from_settings(1.0, ["edit"], 5, "book")
    rebuilt = build_aux_losses([aux.spec() for aux in losses])
    assert [aux.spec() for aux in rebuilt] == [aux.spec() for aux in losses]
    legacy = TokenPPO.upgrade_saved_args(dict(n_epochs=2, tool_coef=1.0, tool_calls=["edit"], practice=5,
                                              practice_tasks="book"))
    assert legacy.pop("n_epochs") == 2 and [a.spec() for a in build_aux_losses(legacy["aux_losses"])] == \
        [a.spec() for a in losses]
    unsafe = {"entry_point": "subprocess:run", "kwargs": {"args": ["true"]}}  # a file may name only aux losses
    for bad, match in (([{"entry_point": "nowhere:Loss"}], "cannot be loaded"), ("tool", "must be a list"),
                       ([unsafe], "not a registered auxiliary loss"),
                       ([{"entry_point": "agents.bugfix.recipes:ppo_kwargs"}], "not a registered"),
                       ([{"kwargs": {}}], "entry_point"), ([losses[0], ToolOutputLoss(2.0)], "distinct names")):
        with pytest.raises(ValueError, match=match) as e:
            TokenPPO("TinyAgentPolicy", vec(2), base_agent=None, aux_losses=bad)
        assert "\n" not in str(e.value)
