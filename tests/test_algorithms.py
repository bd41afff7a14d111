"""The named algorithms: the settings wired through the buffer (scale_rewards, GiGPO's anchor states, the
per-turn settings, CISPO's cap, truncated episodes), GMPO's loss by hand, every preset (first ratio
exactly 1, save / load as its own class and settings, RLOO's identity), TRL's option names, and the
code examples of docs/algorithms.md."""
from __future__ import annotations

import math
import re
from pathlib import Path

import gymnasium as gym
import pytest
import torch

import bugfix_gym
from agents.algorithms import losses
from agents.algorithms.buffers import TokenRolloutBuffer
from agents.algorithms.group_advantages import group_normalised, turn_index
from agents.algorithms.losses import PolicyLossConfig, get_policy_loss_fn
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.presets import (ALGORITHM_NAMES, ALGORITHMS, describe, get_preset, load_algorithm,
                                       make_algorithm)
from agents.algorithms.reinforce import Reinforce
from agents.algorithms.trl_options import from_trl

DOCS = Path(__file__).resolve().parent.parent / "docs" / "algorithms.md"


def _look(name: str = "ppo", **kwargs):
    """A tiny model of preset ``name`` on LookThenAnswer-v0 (a preset with groups: 4 groups of 4)."""
    look = gym.make("LookThenAnswer-v0")
    tok = bugfix_gym.Tokenizer(look.unwrapped.words)
    config = dict(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=64)
    settings = dict(base_agent=None, seed=0, n_episodes=16, policy_kwargs=dict(tokenizer=tok, model_config=config))
    if get_preset(name).settings.get("group_size", 1) > 1:
        settings["group_size"] = 4  # 4 groups in the batch of 16
    return make_algorithm(name, env=look, **dict(settings, **kwargs))


def _episodes(model, rewards=None):
    """16 episodes of the model (every group kept: dynamic sampling off for this draw), with ``rewards``."""
    dropping, model.sampler.drop_zero_variance_groups = model.sampler.drop_zero_variance_groups, False
    try:
        trajs = model.sample_episodes(16)
    finally:
        model.sampler.drop_zero_variance_groups = dropping
    return _with_rewards(trajs, REWARDS if rewards is None else rewards)


def _with_rewards(trajs, rewards):
    """The trajectories with episode return ``rewards[i]``, on the last policy token of each."""
    for traj, r in zip(trajs, rewards):
        last = int(traj.policy_mask.nonzero().max())
        traj.token_rewards = torch.zeros_like(traj.token_rewards)
        traj.token_rewards[last] = r
        traj.reward = float(r)
    return trajs


REWARDS = [1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0, 0.0, 1.0, 1.0]


def _buffer(model, trajs, **kwargs) -> TokenRolloutBuffer:
    buffer = TokenRolloutBuffer(len(trajs), model.observation_space, model.action_space,
                                **dict(model.rollout_buffer_kwargs, **kwargs))
    buffer.add(trajs)
    buffer.compute_returns_and_advantage()
    return buffer


# ---------------------------------------------------------------- the settings reach the estimators and losses

def test_gigpo_through_the_buffer_differs_from_grpo_as_the_formula_says():
    """Every episode of a group starts from one reset, so its first call's state (the prompt) recurs in
    the group; with turn_gamma 1 that turn's return is the episode's, so its step-level advantage is the
    episode's GRPO advantage and GiGPO gives (1 + omega) x GRPO on the first call's tokens."""
    model = _look("gigpo", step_advantage_weight=0.5, turn_gamma=1.0)
    trajs = _episodes(model)
    gigpo = _buffer(model, trajs)
    grpo = _buffer(model, trajs, adv_estimator="grpo")
    mask = gigpo.policy_mask
    first = (turn_index(mask) == 0) & (mask > 0)
    episode = group_normalised(torch.tensor(REWARDS), gigpo.groups)[:, None].expand_as(mask)
    torch.testing.assert_close(grpo.raw_advantages[mask > 0], episode[mask > 0])
    torch.testing.assert_close(gigpo.raw_advantages[first], 1.5 * grpo.raw_advantages[first])
    assert bool((gigpo.raw_advantages[first] != 0).any())
    off = _buffer(model, trajs, step_advantage_weight=0.0)  # omega 0: GRPO exactly
    assert torch.equal(off.raw_advantages, grpo.raw_advantages)


def test_scale_rewards_and_cispos_cap_reach_the_estimator_and_the_loss():
    model = _look("grpo", scale_rewards="none", max_is_weight=2.5)
    assert model.rollout_buffer.advantage_config.scale_rewards == "none"
    trajs = _episodes(model)
    centred = group_normalised(torch.tensor(REWARDS), _buffer(model, trajs).groups, "none")
    adv = _buffer(model, trajs).raw_advantages
    torch.testing.assert_close(adv, centred[:, None] * _buffer(model, trajs).policy_mask)
    seen = []
    real = losses.POLICY_LOSSES.get("ppo_clip")

    def spy(logp, old_logp, advantages, mask, config):
        seen.append(config)
        return real(logp, old_logp, advantages, mask, config)

    losses.POLICY_LOSSES._functions["ppo_clip"] = spy
    try:
        model.train_on_batch(trajs)
    finally:
        losses.POLICY_LOSSES._functions["ppo_clip"] = real
    assert seen and all(config.max_is_weight == 2.5 for config in seen)


def _truncated_first(model):
    """A batch whose first episode ended truncated and the others not (the sampler records truncation:
    a random policy never answers, so every episode runs out of turns)."""
    trajs = _episodes(model)
    assert all(t.info.get("TimeLimit.truncated") for t in trajs)
    for t in trajs[1:]:
        t.info = dict(t.info, **{"TimeLimit.truncated": False})
    return trajs


def test_a_truncated_episode_contributes_zero_gradient_to_token_ppo(monkeypatch):
    """mask_truncated_completions: autograd gives the truncated episode's log-probs no gradient, the others some."""
    model = _look("grpo", mask_truncated_completions=True, n_epochs=1, batch_size=16)
    trajs = _truncated_first(model)
    real, scored = model._score, []

    def keep(net, sample):
        out = real(net, sample)
        if torch.is_grad_enabled():  # the update's pass, not pi_old's frozen one
            out[0].retain_grad()
            scored.append((out[0], sample.indices))
        return out

    monkeypatch.setattr(model, "_score", keep)
    model.train_on_batch(trajs)
    logp, rows = scored[0]
    assert logp.grad is not None
    assert bool((logp.grad[rows == 0] == 0).all()) and bool((logp.grad[rows != 0] != 0).any())


def test_a_truncated_episode_contributes_zero_gradient_to_reinforce(monkeypatch):
    import agents.algorithms.reinforce as module
    from stable_baselines3.common.logger import configure

    model = _look("reinforce", mask_truncated_completions=True)
    trajs = _truncated_first(model)
    real, scored = module.score_tokens, []

    def keep(*args, **kwargs):
        out = real(*args, **kwargs)
        out[0].retain_grad()
        scored.append(out[0])
        return out

    monkeypatch.setattr(module, "score_tokens", keep)
    model.rollout_buffer.reset()
    model.rollout_buffer.add(trajs)
    model._logger = configure(folder=None, format_strings=[])
    model.train()
    logp = scored[0]
    assert logp.grad is not None and bool((logp.grad[0] == 0).all()) and bool((logp.grad[1:] != 0).any())


# ---------------------------------------------------------------- GMPO by hand

def test_gmpo_loss_and_gradient_worked_by_hand():
    """Episode 0 (A = +1): log-ratios (0.1, 0.6, -0.5); for A > 0 the clip holds 0.6 at 0.4 and leaves
    -0.5, so the mean is 0, the ratio 1, J = 1, and the gradient on the two free tokens is 1/3 each.
    Episode 1 (A = -2, two tokens): (0.5, -0.6); for A < 0 the clip holds -0.6 at -0.4 and leaves 0.5,
    mean 0.05, J = -2 e^0.05, gradient -e^0.05 on the first token. seq_mean_token_mean halves both."""
    old = torch.zeros(2, 3)
    logp = torch.tensor([[0.1, 0.6, -0.5], [0.5, -0.6, 0.0]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    config = PolicyLossConfig(clip_low=0.4, clip_high=0.4, mode="seq_mean_token_mean")
    loss, stats = get_policy_loss_fn("gmpo")(logp, old, adv, mask, config)
    e = math.exp(0.05)
    assert loss.item() == pytest.approx(-(1.0 - 2.0 * e) / 2, abs=1e-6)
    loss.backward()
    expected = torch.tensor([[-1 / 6, 0.0, -1 / 6], [e / 2, 0.0, 0.0]])
    torch.testing.assert_close(logp.grad, expected)
    assert stats["clip_frac"] == pytest.approx(2 / 5)
    per_token = torch.tensor([[0.0, 0.0, 0.0], [0.0, 0.0, 0.0]], requires_grad=True)  # on-policy: ratio 1
    loss0, stats0 = get_policy_loss_fn("gmpo")(per_token, old, adv, mask, config)
    assert stats0["ratio_min"] == stats0["ratio_max"] == 1.0 and stats0["clip_frac"] == 0.0
    assert loss0.item() == pytest.approx(-(1.0 - 2.0) / 2)


def test_gmpo_ignores_padding_even_when_it_holds_nan():
    logp = torch.tensor([[0.1, float("nan")]], requires_grad=True)
    loss, _ = get_policy_loss_fn("gmpo")(logp, torch.zeros(1, 2), torch.tensor([1.0]), torch.tensor([[1.0, 0.0]]),
                                         PolicyLossConfig(clip_low=0.4, clip_high=0.4, mode="seq_mean_token_mean"))
    loss.backward()
    assert math.isfinite(loss.item()) and logp.grad is not None and logp.grad[0, 0] != 0


# ---------------------------------------------------------------- the presets

@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_preset_s_first_ratio_is_exactly_one(name):
    """One update on one fixed batch: the first policy-loss call sees pi == pi_old exactly on every
    policy token (pi_old frozen in the first minibatch's own layout; Reinforce's pi_old is pi itself)."""
    model = _look(name)
    trajs = _episodes(model)
    for traj in trajs:  # every episode ended in time: DAPO's overlong filter would mask this untrained model's all
        traj.info = dict(traj.info, **{"TimeLimit.truncated": False})
    loss_name = model.config.policy_loss
    real = losses.POLICY_LOSSES.get(loss_name)
    ratios = []

    def spy(logp, old_logp, advantages, mask, config):
        ratios.append(torch.exp(logp - old_logp)[mask > 0].detach())
        return real(logp, old_logp, advantages, mask, config)

    losses.POLICY_LOSSES._functions[loss_name] = spy
    try:
        if isinstance(model, TokenPPO):
            epochs = model.train_on_batch(trajs)
            assert epochs and math.isfinite(epochs[0]["loss"])
        else:
            model.rollout_buffer.reset()
            model.rollout_buffer.add(trajs)
            from stable_baselines3.common.logger import configure
            model._logger = configure(folder=None, format_strings=[])
            model.train()
    finally:
        losses.POLICY_LOSSES._functions[loss_name] = real
    assert ratios and ratios[0].numel() > 0
    assert float(ratios[0].min()) == float(ratios[0].max()) == 1.0


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_a_saved_preset_loads_as_its_class_with_its_settings(name, tmp_path):
    model = _look(name)
    assert type(model) is get_preset(name).cls and model.config.preset == name
    for key, value in get_preset(name).settings.items():
        if key != "group_size":  # _look sets group_size
            assert getattr(model.config, key) == value, key
    model.save(tmp_path / "m.zip")
    loaded = load_algorithm(tmp_path / "m.zip")
    assert type(loaded) is type(model) and loaded.config.preset == name
    assert loaded.saved_arguments() == model.saved_arguments()


def test_overrides_win_over_the_preset_and_a_setting_the_class_lacks_is_one_line():
    assert _look("dapo", clip_range_high=0.3).config.clip_range_high == 0.3
    with pytest.raises(TypeError, match="unexpected keyword argument 'n_epochs'"):
        _look("reinforce", n_epochs=2)
    with pytest.raises(ValueError, match="algo must be one of ppo, reinforce, grpo"):
        make_algorithm("grpo2")


def test_the_ppo_and_reinforce_presets_are_today_s_classes_exactly():
    ppo, reinforce = _look("ppo"), _look("reinforce")
    plain_ppo = TokenPPO("TinyAgentPolicy", ppo.env, base_agent=None, seed=0, n_episodes=16,
                         policy_kwargs=ppo.policy_kwargs)
    assert {**ppo.saved_arguments(), "preset": None} == plain_ppo.saved_arguments()
    plain = Reinforce("TinyAgentPolicy", reinforce.env, base_agent=None, seed=0, n_episodes=16,
                      policy_kwargs=reinforce.policy_kwargs)
    assert {**reinforce.saved_arguments(), "preset": None} == plain.saved_arguments()


def test_dr_grpo_s_constant_is_the_most_policy_tokens_of_an_episode():
    model = _look("dr_grpo")
    assert model.config.loss_norm_const == 3 * model.config.max_call_tokens  # LookThenAnswer's 3 turns x 8 call tokens
    assert _look("dr_grpo", loss_norm_const=10.0).config.loss_norm_const == 10.0


def test_rloo_through_its_preset_is_centred_advantages_times_g_over_g_minus_one():
    model = _look("rloo")
    trajs = _episodes(model)
    buffer = _buffer(model, trajs, kl_reward_coef=0.0)  # the estimator alone (its KL in the reward: test_kl_in_reward)
    g = 4
    centred = group_normalised(torch.tensor(REWARDS), buffer.groups, "none")
    torch.testing.assert_close(buffer.advantages, (centred * g / (g - 1))[:, None] * buffer.policy_mask)
    sums = torch.zeros(4).index_add_(0, buffer.groups, buffer.advantages.sum(1) / buffer.policy_mask.sum(1))
    torch.testing.assert_close(sums, torch.zeros(4), atol=1e-6, rtol=0)


def test_every_name_of_the_issue_is_a_preset():
    assert ALGORITHM_NAMES == ("ppo", "reinforce", "grpo", "dr_grpo", "dapo", "rloo", "reinforce_pp",
                               "reinforce_pp_baseline", "gspo", "cispo", "gmpo", "rebn", "gigpo")
    assert all(ALGORITHMS[name].summary for name in ALGORITHM_NAMES)


# ---------------------------------------------------------------- TRL's names

def test_trl_options_map_to_our_settings_with_trl_s_semantics():
    assert from_trl(loss_type="grpo") == dict(loss_mode="seq_mean_token_mean")
    assert from_trl(loss_type="bnpo") == dict(loss_mode="token_mean")  # each minibatch's own token count
    assert from_trl(loss_type="dapo") == dict(loss_mode="token_mean", n_minibatches=1)  # the whole batch's
    assert from_trl(loss_type="dr_grpo", max_completion_length=48) == dict(loss_mode="seq_mean_token_sum_norm",
                                                                           loss_norm_const=48.0)
    assert from_trl(epsilon=0.2, epsilon_high=0.28) == dict(clip_range=0.2, clip_range_high=0.28)
    # CISPO: epsilon_high is an ABSOLUTE cap on the weight; without it TRL falls back to epsilon
    assert from_trl(loss_type="cispo", epsilon=0.2, epsilon_high=5.0) == dict(
        loss_mode="token_mean", n_minibatches=1, policy_loss="cispo", max_is_weight=5.0)
    assert from_trl(loss_type="cispo", epsilon=0.2)["max_is_weight"] == 0.2
    assert from_trl(importance_sampling_level="sequence") == dict(policy_loss="gspo")
    assert from_trl(importance_sampling_level="token", policy_loss="gspo") == dict(policy_loss="ppo_clip")
    assert from_trl(importance_sampling_level="token", policy_loss="gmpo") == {}
    assert from_trl(loss_type="dapo", policy_loss="cispo")["policy_loss"] == "ppo_clip"
    assert from_trl(beta=0.04) == dict(kl_coef=0.04, kl_estimator="k3")
    assert from_trl(num_iterations=2) == dict(n_epochs=2)
    assert from_trl(scale_rewards=True) == dict(scale_rewards="group")
    assert from_trl(scale_rewards=False) == from_trl(scale_rewards="none") == dict(scale_rewards="none")
    assert from_trl(scale_rewards="batch") == dict(scale_rewards="batch")
    assert from_trl(mask_truncated_completions=True) == dict(mask_truncated_completions=True)
    assert from_trl() == {}
    with pytest.raises(ValueError, match="loss_type must be one of"):
        from_trl(loss_type="sapo")
    with pytest.raises(ValueError, match="no sequence form"):
        from_trl(loss_type="cispo", importance_sampling_level="sequence")


def test_trl_s_dapo_config_builds_the_dapo_preset_s_loss():
    settings = from_trl(loss_type="dapo", epsilon=0.2, epsilon_high=0.28, beta=0.0)
    model = _look("grpo", **settings)
    dapo = get_preset("dapo").settings
    cfg = model.config
    assert (cfg.loss_mode, cfg.clip_range_high, cfg.kl_coef, cfg.n_minibatches) == \
        (dapo["loss_mode"], dapo["clip_range_high"], 0.0, dapo["n_minibatches"])


# ---------------------------------------------------------------- docs/algorithms.md

def _snippets() -> dict[str, str]:
    """The ```python blocks of the docs' examples, by the preset name in their heading."""
    text = DOCS.read_text()
    part = text.split("## Examples", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"### `(\w+)`\n+```python\n(.*?)```", part, re.S)}


def test_the_docs_have_one_example_per_algorithm_and_each_builds_it(monkeypatch):
    """Each snippet's construction runs (``learn`` is replaced by a no-op: the runs live in examples/)."""
    snippets = _snippets()
    assert set(snippets) == set(ALGORITHM_NAMES)
    look = gym.make("LookThenAnswer-v0")
    tok = bugfix_gym.Tokenizer(look.unwrapped.words)
    tiny = dict(tokenizer=tok, model_config=dict(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2,
                                                 d_ff=32, max_len=64))
    import agents.algorithms.presets as presets
    real = presets.make_algorithm

    def small(name, policy="TinyAgentPolicy", env=None, **overrides):  # the tiny model on LookThenAnswer
        return real(name, policy, look, **dict(overrides, base_agent=None, policy_kwargs=tiny))

    monkeypatch.setattr(presets, "make_algorithm", small)
    monkeypatch.setattr(TokenPPO, "learn", lambda self, *a, **k: self)
    monkeypatch.setattr(Reinforce, "learn", lambda self, *a, **k: self)
    for name, code in snippets.items():
        scope: dict = {}
        exec(code, scope)
        assert scope["model"].config.preset == name, name


def test_the_docs_presets_table_lists_every_preset_s_settings():
    text = DOCS.read_text()
    for name in ALGORITHM_NAMES:
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, name
        assert get_preset(name).cls.__name__ in row
        for key, value in get_preset(name).settings.items():
            assert f"{key}={value!r}" in row, (name, key)
    assert describe("ppo") == ""
    table = text[text.index("## The table"):]  # the measured table has a row for every name (book protocol)
    assert all(f"| `{name}` | 5 |" in table for name in ALGORITHM_NAMES)
    generalisation = table[table.index("### b."):table.index("### c.")]  # and on the RL-only protocol (3 seeds)
    assert all(f"| `{name}` | 3 |" in generalisation for name in ALGORITHM_NAMES)


def test_reinforce_reads_gigpo_s_anchor_states_too():
    """Reinforce builds the anchor-state keys for GiGPO as TokenPPO's buffer does: on the first call's
    tokens (the shared prompt) GiGPO is (1 + omega) x GRPO."""
    model = _look("reinforce", adv_estimator="gigpo", step_advantage_weight=0.5, group_size=4)
    trajs = _episodes(model)
    model.rollout_buffer.reset()
    model.rollout_buffer.add(trajs)
    batch = dict(model.rollout_buffer.data)
    gigpo = model._advantages(model.rollout_buffer, batch, 0.0)
    model.config.adv_estimator = "grpo"
    grpo = model._advantages(model.rollout_buffer, batch, 0.0)
    mask = batch["policy_mask"]
    first = (turn_index(mask) == 0) & (mask > 0)
    torch.testing.assert_close(gigpo[first], 1.5 * grpo[first])
    assert bool((grpo[first] != 0).any())


def test_an_env_s_batch_statistics_are_logged_only_when_it_advertises_them():
    """SB3's info_keywords pattern: any env's batch logs its mean return and turns; an env's own statistics
    are logged when its metadata names them (``agent_defaults["logged_stats"]``), never a fixed list."""
    from stable_baselines3.common.logger import KVWriter, Logger

    class Capture(KVWriter):
        def __init__(self):
            self.keys = set()

        def write(self, key_values, key_excluded, step=0):
            self.keys |= set(key_values)

    model = _look("reinforce")
    cap = Capture()
    model.set_logger(Logger(folder=None, output_formats=[cap]))
    model.learn(16)
    assert {"rollout/reward", "rollout/turns"} <= cap.keys and "rollout/pass_rate" not in cap.keys
    summary = dict(episode_summary=f"{__name__}:_summary")
    env = model.env.envs[0].unwrapped
    env.metadata = dict(env.metadata, agent_defaults=summary)  # a summary, but no key advertised: not logged
    model.learn(16)
    assert "rollout/answers" not in cap.keys and "rollout/reward" in cap.keys
    env.metadata = dict(env.metadata, agent_defaults=dict(summary, logged_stats=["answers"]))
    model.learn(16)
    assert "rollout/answers" in cap.keys


def _summary(infos, rewards):
    return dict(reward=sum(rewards) / len(rewards), turns=1.0, answers=float(len(infos)))
