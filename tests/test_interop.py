"""The array views in other RL libraries: SB3, sb3-contrib, TorchRL, Tianshou, gymnasium vector envs.

Each test is a few env steps or one short update, and checks something a library needs
from the env (fixed-shape numeric info, bool masks under the library's key, masks
respected, a buffer taking whole episodes, an update that moves the parameters).
Training to a pass rate is in ``examples/`` (figures in docs/interop.md).
"""

from __future__ import annotations

import warnings

import gymnasium as gym
import numpy as np
import pytest
import torch
from stable_baselines3.common.env_checker import check_env as sb3_check_env

from bugfix_gym import CALLS, BugFixEnv, build_tokenizer, episode_tokens, get_task, make_tasks
from bugfix_gym.views.wrappers import LAYOUTS, STOP_REASONS, VIEW_INFO_KEYS, DiscreteCalls, TokenObservation

TOK = build_tokenizer()
REVERT = CALLS.index("revert")
PLAY = ("revert", "read", "edit swap_minmax", "revert", "test", "edit fix_init", "submit")  # the first is illegal


def _params(module: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in module.parameters()]


def _moved(before: list[torch.Tensor], module: torch.nn.Module) -> bool:
    return any(not torch.equal(a, b) for a, b in zip(before, module.parameters()))


# ---------------------------------------------------------------- env fixes the libraries needed
def test_tasks_must_be_task_objects_at_construction():
    with pytest.raises(TypeError, match=r"tasks\[0\] is a dict, not a bugfix_gym.Task"):
        BugFixEnv(tasks=[{"name": "clamp", "source": "def clamp(x): ..."}])
    with pytest.raises(TypeError, match=r"tasks\[1\] is a str"):
        BugFixEnv(tasks=[get_task("clamp"), "spread"])
    with pytest.raises(TypeError, match="use split= for a split"):
        BugFixEnv(tasks="heldout")
    env = BugFixEnv(tasks=(t for t in make_tasks("heldout")))  # any iterable of Task is fine
    assert env.split == "custom" and len(env.tasks) == len(make_tasks("heldout"))


def test_sb3_make_vec_env_builds_from_the_id_with_its_default_render_mode():
    from stable_baselines3.common.env_util import make_vec_env

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no render_mode warning for SB3's default "rgb_array"
        venv = make_vec_env("BugFixCalls-v0", n_envs=2, seed=0, env_kwargs={"max_len": 64})
    obs = venv.reset()
    assert obs["ids"].shape == (2, 64) and obs["action_mask"].dtype == bool
    assert venv.get_attr("render_mode") == [None, None]


# ---------------------------------------------------------------- info: fixed keys, numbers only
def _play_episode(env: gym.Env) -> list[dict]:
    _, info = env.reset(options={"task": "spread"})
    infos = [info]
    for call in PLAY:
        if isinstance(env.action_space, gym.spaces.Discrete):
            action = CALLS.index(call)
        else:
            action = np.array(TOK.encode(call) + [TOK.eoc_id], dtype=np.int64)
        *_, info = env.step(action)
        infos.append(info)
    return infos


@pytest.mark.parametrize("make", [lambda: DiscreteCalls(BugFixEnv(max_turns=8), TOK, max_len=128),
                                  lambda: TokenObservation(BugFixEnv(max_turns=8), TOK, max_len=128)],
                         ids=["DiscreteCalls", "TokenObservation"])
def test_view_info_has_fixed_keys_and_types_and_no_none(make):
    infos = _play_episode(make())
    for info in infos:
        assert tuple(info) == VIEW_INFO_KEYS
        assert {k: type(v) for k, v in info.items()} == {k: type(v) for k, v in infos[0].items()}
        assert info["call_mask"].dtype == bool and info["call_mask"].shape == (len(CALLS),)
        assert all(isinstance(v, (bool, int, np.ndarray)) for v in info.values())
    assert [i["n_edits"] for i in infos] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert [i["last_call"] for i in infos] == [-1, -1, *(CALLS.index(c) for c in PLAY[1:])]  # -1: none, illegal
    assert [STOP_REASONS[i["stop_code"]] for i in infos] == [""] * 7 + ["submit"]
    env_tasks = [t.name for t in make().unwrapped.tasks]
    assert infos[0]["task_index"] == env_tasks.index("spread")


def test_view_info_keeps_the_history_on_the_unwrapped_env_and_task_index_is_minus_one_outside_it():
    env = DiscreteCalls(BugFixEnv(split="heldout"), TOK)
    _, info = env.reset(options={"task": get_task("clamp")})  # a train task, not in this env's list
    assert info["task_index"] == -1
    env.step(CALLS.index("edit fix_init"))
    *_, info = env.step(CALLS.index("read"))
    assert env.unwrapped.actions == ["edit fix_init", "read"] and env.unwrapped.ops == ["fix_init"]
    assert info["n_edits"] == 1 and info["last_call"] == CALLS.index("read")


def test_sync_and_async_vector_envs_stack_the_info_into_numeric_arrays():
    for mode in ("sync", "async"):  # async with default shared memory: the views hold no Text
        envs = gym.make_vec("BugFixCalls-v0", num_envs=2, vectorization_mode=mode, max_len=64)
        obs, info = envs.reset(seed=[3, 4])
        for _ in range(7):  # past the 6-turn budget: an autoreset happens
            obs, _, _, _, info = envs.step(np.array([0, 1]))
        envs.close()
        assert all(v.dtype != object for v in info.values()), {k: v.dtype for k, v in info.items()}
        assert info["call_mask"].shape == (2, len(CALLS)) and info["n_turns"].dtype.kind == "i"
        if mode == "sync":
            sync_obs = obs
    assert all(np.array_equal(sync_obs[k], obs[k]) for k in obs)  # async returns the same, fresh arrays


# ---------------------------------------------------------------- layouts and registered ids
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_passes_sb3_and_gymnasium_check_env(layout):
    from gymnasium.utils.env_checker import check_env

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sb3_check_env(gym.make("BugFixCalls-v0", max_len=64, layout=layout))
        check_env(gym.make("BugFixCalls-v0", max_len=64, layout=layout).env.env)  # the view, under gymnasium's
    assert [str(w.message) for w in caught if "different from the unwrapped" not in str(w.message)] == []


def test_layouts_hold_the_same_tokens_and_bool_mask_under_each_librarys_keys():
    envs = {layout: DiscreteCalls(BugFixEnv(), TOK, max_len=96, layout=layout) for layout in LAYOUTS}
    obs = {layout: env.reset(options={"task": "clamp"})[0] for layout, env in envs.items()}
    for call in ("edit swap_minmax", "test"):
        obs = {layout: env.step(CALLS.index(call))[0] for layout, env in envs.items()}
    ref = obs["dict"]
    tokens = np.concatenate([ref["ids"], ref["owner"]]).astype(np.float32)
    assert set(obs["tianshou"]) == {"obs", "mask"} and set(obs["rllib"]) == {"observations", "action_mask"}
    assert np.array_equal(obs["tianshou"]["obs"], tokens) and np.array_equal(obs["rllib"]["observations"], tokens)
    for mask in (ref["action_mask"], obs["tianshou"]["mask"], obs["rllib"]["action_mask"]):
        assert mask.dtype == bool and mask.all()  # revert is legal after an edit
    first = envs["rllib"].reset(options={"task": "clamp"})[0]["action_mask"]
    assert not first[REVERT] and envs["rllib"].action_masks().tolist() == first.tolist()
    with pytest.raises(ValueError, match="layout must be one of"):
        DiscreteCalls(BugFixEnv(), TOK, layout="Tianshou")


def test_registered_ids_pass_view_and_env_arguments_and_rebuild_from_their_spec():
    env = gym.make("BugFixCalls-v0", max_len=64, layout="rllib", split="heldout", max_turns=4)
    assert env.unwrapped.split == "heldout" and env.unwrapped.max_turns == 4
    assert env.observation_space["observations"].shape == (128,)
    rebuilt = env.spec.make()
    assert rebuilt.observation_space == env.observation_space and rebuilt.unwrapped.split == "heldout"
    tokens = gym.make("bugfix_gym:BugFixTokens-v0", max_len=32, max_call_tokens=4)
    assert tokens.action_space.shape == (4,) and tokens.observation_space["ids"].shape == (32,)


def test_view_segments_come_from_encode_segment_so_a_turn_marker_flows_in(monkeypatch):
    # Simulates a tokenizer change that appends a marker after every prompt and tool segment:
    # the view must follow it, as episode_tokens does, without code of its own.
    import bugfix_gym.contract.tokens
    import bugfix_gym.views.wrappers

    plain = bugfix_gym.contract.tokens.encode_segment
    marker = TOK.ids["read"]  # any id; owner codes, not ids, say who wrote it

    def with_marker(tokenizer, owner, text):
        ids = plain(tokenizer, owner, text)
        return ids if owner == 2 else ids + [marker]

    monkeypatch.setattr(bugfix_gym.contract.tokens, "encode_segment", with_marker)
    monkeypatch.setattr(bugfix_gym.views.wrappers, "encode_segment", with_marker)
    env = DiscreteCalls(BugFixEnv(), TOK, max_len=256)
    obs, _ = env.reset(options={"task": "clamp"})
    for call in ("read", "edit swap_minmax", "submit"):
        obs, *_ = env.step(CALLS.index(call))
    ids, owner = episode_tokens(env.unwrapped.transcript, TOK)
    n = len(ids)
    assert obs["ids"][:n].tolist() == ids.tolist() and obs["owner"][:n].tolist() == owner.tolist()
    ends = np.flatnonzero(np.diff(owner) != 0)  # last token of each segment but the final one
    assert all(ids[k] == marker for k in ends if owner[k] != 2) and ids[-1] == marker


# ---------------------------------------------------------------- Stable-Baselines3
@pytest.mark.parametrize("algo", ["PPO", "A2C", "DQN"])
def test_sb3_algorithms_update_on_the_registered_view(algo):
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # what the array view warns, tested elsewhere
        venv = make_vec_env("BugFixCalls-v0", n_envs=2, seed=0, env_kwargs={"max_len": 64})
    cls = getattr(stable_baselines3, algo)
    kwargs = {"PPO": dict(n_steps=16, batch_size=32, n_epochs=1), "A2C": dict(n_steps=8),
              "DQN": dict(learning_starts=16, batch_size=16, train_freq=1, buffer_size=200,
                          replay_buffer_kwargs={"handle_timeout_termination": False})}[algo]
    model = cls("MultiInputPolicy", venv, seed=0, device="cpu", **kwargs)
    before = _params(model.policy)
    model.learn(64)
    assert model.num_timesteps >= 64 and _moved(before, model.policy)


# ---------------------------------------------------------------- TorchRL
@pytest.mark.heavy
def test_torchrl_wraps_the_vector_env_and_reads_its_info():
    from torchrl.envs import GymWrapper
    from torchrl.envs.utils import check_env_specs

    envs = gym.make_vec("BugFixCalls-v0", num_envs=2, vectorization_mode="sync", max_len=64,
                        vector_kwargs={"autoreset_mode": gym.vector.AutoresetMode.SAME_STEP})  # TorchRL's ask
    env = GymWrapper(envs, categorical_action_encoding=True)
    check_env_specs(env)
    rollout = env.rollout(8, break_when_any_done=False)  # past the 6-turn budget: autoresets included
    done = rollout["next", "done"].squeeze(-1)  # [2, 8]
    assert rollout.batch_size == (2, 8) and done.any(dim=1).all()
    assert rollout["next", "n_turns"].dtype == torch.int64 and rollout["next", "call_mask"].dtype == torch.bool
    assert (rollout["next", "stop_code"][done] >= 1).all() and (rollout["next", "stop_code"][~done] == 0).all()
    assert rollout["action_mask"].dtype == torch.bool
    env.close()


def test_torchrl_action_mask_transform_and_masked_categorical_ppo_update():
    from tensordict.nn import TensorDictModule
    from torchrl.envs import ActionMask, GymEnv, TransformedEnv
    from torchrl.modules import MaskedCategorical, ProbabilisticActor, ValueOperator
    from torchrl.objectives import ClipPPOLoss
    from torchrl.objectives.value import GAE

    env = TransformedEnv(GymEnv("BugFixCalls-v0", max_len=64, categorical_action_encoding=True), ActionMask())
    env.set_seed(0)
    random_rollout = env.rollout(40, break_when_any_done=False)  # ActionMask: the random policy is masked
    taken = random_rollout["action_mask"].gather(-1, random_rollout["action"].unsqueeze(-1))
    assert taken.all() and (~random_rollout["action_mask"]).any()

    class Net(torch.nn.Module):
        def __init__(self, out: int, favour: int | None = None):
            super().__init__()
            self.lin = torch.nn.Linear(128, out)
            if favour is not None:  # the net wants this call; only the mask can stop it
                torch.nn.init.zeros_(self.lin.weight)
                with torch.no_grad():
                    self.lin.bias.fill_(0.0)
                    self.lin.bias[favour] = 50.0

        def forward(self, ids, owner):
            return self.lin(torch.cat([ids, owner], -1).float())

    def make_actor(net: Net) -> ProbabilisticActor:
        return ProbabilisticActor(TensorDictModule(net, ["ids", "owner"], ["logits"]),
                                  in_keys={"logits": "logits", "mask": "action_mask"},
                                  distribution_class=MaskedCategorical, spec=env.action_spec, return_log_prob=True)

    with torch.no_grad():
        data = env.rollout(24, make_actor(Net(len(CALLS), favour=REVERT)), break_when_any_done=False)
    masked_out = ~data["action_mask"][:, REVERT]
    assert masked_out.any() and (data["action"][masked_out] != REVERT).all()
    assert (data["action"][~masked_out] == REVERT).all()  # where legal, the wanted call is taken

    torch.manual_seed(0)
    actor, critic = make_actor(Net(len(CALLS))), ValueOperator(Net(1), in_keys=["ids", "owner"])
    with torch.no_grad():
        data = env.rollout(24, actor, break_when_any_done=False)
        GAE(gamma=0.99, lmbda=0.95, value_network=critic)(data)
    loss_fn = ClipPPOLoss(actor, critic, entropy_coeff=0.01)
    before = _params(loss_fn)
    losses = loss_fn(data)
    (losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]).backward()
    torch.optim.SGD(loss_fn.parameters(), lr=0.1).step()
    assert all(torch.isfinite(v).all() for v in losses.values()) and _moved(before, loss_fn)
    env.close()


@pytest.mark.filterwarnings("ignore:Nested TransformedEnvs:UserWarning")
def test_torchrl_gymenv_with_subprocess_workers():
    """The reported crash path, ``GymEnv(id, num_envs=2)``: two spawned workers, 8 steps. In the fast
    suite: about 4 s here (2 shared cores), nearly all of it the workers importing torch."""
    from torchrl.envs import ActionMask, GymEnv, TransformedEnv

    # spawned workers import nothing of this process: the module-qualified id imports bugfix_gym there
    env = TransformedEnv(GymEnv("bugfix_gym:BugFixCalls-v0", num_envs=2, max_len=64), ActionMask())
    rollout = env.rollout(8, break_when_any_done=False)  # past the 6-turn budget
    assert rollout.batch_size == (2, 8) and rollout["next", "done"].any()
    assert rollout["next", "n_turns"].dtype == torch.int64 and rollout["action_mask"].dtype == torch.bool
    env.close()


# ---------------------------------------------------------------- Tianshou
def _tianshou_envs(n: int):
    from tianshou.env import DummyVectorEnv

    envs = DummyVectorEnv([lambda: gym.make("BugFixCalls-v0", max_len=64, layout="tianshou") for _ in range(n)])
    envs.seed(0)
    return envs


class _TianshouMLP(torch.nn.Module):
    """Reads ``obs.obs`` (DQN hands over ``obs.obs`` itself); ``masked`` actors apply ``obs.mask`` to their logits."""

    def __init__(self, out: int, masked: bool = False, favour: int | None = None):
        super().__init__()
        self.lin, self.masked = torch.nn.Linear(128, out), masked
        if favour is not None:
            torch.nn.init.zeros_(self.lin.weight)
            with torch.no_grad():
                self.lin.bias.fill_(0.0)
                self.lin.bias[favour] = 50.0

    def forward(self, obs, state=None, info=None):
        out = self.lin(torch.as_tensor(obs.obs if hasattr(obs, "obs") else obs, dtype=torch.float32))
        if self.masked:
            out = out.masked_fill(~torch.as_tensor(obs.mask, dtype=torch.bool), torch.finfo(out.dtype).min)
        return (out, state) if out.shape[-1] > 1 else out


@pytest.mark.heavy
def test_tianshou_buffer_takes_whole_episodes_with_the_view_info():
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.data import Collector, VectorReplayBuffer

    envs = _tianshou_envs(2)
    space = gym.make("BugFixCalls-v0", max_len=64, layout="tianshou")
    policy = DiscreteActorPolicy(actor=_TianshouMLP(len(CALLS), masked=True), action_space=space.action_space)
    buffer = VectorReplayBuffer(64, 2)
    stats = Collector(policy, envs, buffer, raise_on_nan_in_buffer=True).collect(n_episode=4, reset_before_collect=True)
    assert stats.n_collected_episodes >= 4 and len(buffer) == stats.n_collected_steps
    batch, _ = buffer.sample(0)
    assert batch.obs.mask.dtype == bool and batch.obs.obs.shape == (len(buffer), 128)
    assert batch.info.n_turns.dtype.kind == "i" and batch.info.call_mask.shape == (len(buffer), len(CALLS))
    assert batch.obs.mask[np.arange(len(buffer)), batch.act].all()  # the masked actor never took a masked call
    envs.close()


def test_tianshou_dqn_masks_with_obs_mask_and_ppo_updates():
    from tianshou.algorithm import DQN, PPO
    from tianshou.algorithm.algorithm_base import policy_within_training_step
    from tianshou.algorithm.modelfree.dqn import DiscreteQLearningPolicy
    from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
    from tianshou.algorithm.optim import AdamOptimizerFactory
    from tianshou.data import Collector, VectorReplayBuffer

    space = gym.make("BugFixCalls-v0", max_len=64, layout="tianshou")
    q_policy = DiscreteQLearningPolicy(model=_TianshouMLP(len(CALLS), favour=REVERT), action_space=space.action_space,
                                       eps_training=0.0, eps_inference=0.0)
    envs = _tianshou_envs(2)
    buffer = VectorReplayBuffer(64, 2)
    Collector(DQN(policy=q_policy, optim=AdamOptimizerFactory(lr=1e-3)), envs, buffer).collect(
        n_step=24, reset_before_collect=True)
    batch, _ = buffer.sample(0)
    first = ~batch.obs.mask[:, REVERT]  # revert is masked before any change: DQN must not pick it there
    assert first.any() and (batch.act[first] != REVERT).all() and (batch.act[~first] == REVERT).all()

    actor, critic = _TianshouMLP(len(CALLS), masked=True), _TianshouMLP(1)
    algorithm = PPO(policy=DiscreteActorPolicy(actor=actor, action_space=space.action_space), critic=critic,
                    optim=AdamOptimizerFactory(lr=1e-3))
    buffer = VectorReplayBuffer(64, 2)
    Collector(algorithm, envs, buffer).collect(n_step=32, reset_before_collect=True)
    before = _params(actor) + _params(critic)
    with policy_within_training_step(algorithm.policy):  # what Tianshou's trainer does around update()
        algorithm.update(buffer=buffer, batch_size=16, repeat=1)
    after = list(actor.parameters()) + list(critic.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after))
    envs.close()
