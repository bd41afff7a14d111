"""Train Tianshou's PPO on BugFix-v0 through ``BugFixCalls-v0`` with ``layout="tianshou"``.

The ``"tianshou"`` layout gives the observation as ``{"obs": tokens, "mask": call mask}``,
the form Tianshou's own masked envs use: its collector and buffer store it as
``batch.obs.obs`` / ``batch.obs.mask``, and its DQN-family policies mask with it. Tianshou's
PPO does not read the mask itself, so the actor below does: it sets the logits of masked
calls to the lowest float before the categorical distribution. Everything else (vector
env, collector, buffer, GAE, clipped loss, trainer) is Tianshou's.

    python examples/tianshou_ppo.py [--steps 20000] [--seed 0]

Figures (pass rate before -> after, run time) are in docs/interop.md. Writes only
``runs/interop/tianshou_ppo.json``.
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from tianshou.algorithm import PPO
from tianshou.algorithm.modelfree.reinforce import DiscreteActorPolicy
from tianshou.algorithm.optim import AdamOptimizerFactory
from tianshou.data import Batch, Collector, VectorReplayBuffer
from tianshou.env import DummyVectorEnv
from tianshou.trainer import OnPolicyTrainerParams
from torch import nn

from interop_common import ENV_ID, MAX_LEN, Timer, evaluate, report, set_threads

N_CALLS = 9
N_ENVS = 8


def mlp(out: int, hidden: int = 64) -> nn.Sequential:
    return nn.Sequential(nn.Linear(2 * MAX_LEN, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                         nn.Linear(hidden, out))


class MaskedActor(nn.Module):
    """Call logits from ``obs.obs`` (token ids then owner codes), masked by ``obs.mask``."""

    def __init__(self):
        super().__init__()
        self.net = mlp(N_CALLS)

    def forward(self, obs: Batch, state: Any = None, info: Any = None) -> tuple[torch.Tensor, Any]:
        logits = self.net(torch.as_tensor(obs.obs, dtype=torch.float32))  # [B, 9]
        mask = torch.as_tensor(obs.mask, dtype=torch.bool)  # [B, 9]
        return logits.masked_fill(~mask, torch.finfo(logits.dtype).min), state


class Critic(nn.Module):
    """V(s) from ``obs.obs``."""

    def __init__(self):
        super().__init__()
        self.net = mlp(1)

    def forward(self, obs: Batch, state: Any = None, info: Any = None) -> torch.Tensor:
        return self.net(torch.as_tensor(obs.obs, dtype=torch.float32))  # [B, 1]


def make_env() -> gym.Env:
    return gym.make(ENV_ID, max_len=MAX_LEN, layout="tianshou")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20_000, help="environment steps (default: 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_threads()
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)  # Tianshou shuffles minibatches with numpy's global generator

    envs = DummyVectorEnv([make_env for _ in range(N_ENVS)])  # SubprocVectorEnv works too, under the guard
    envs.seed(args.seed)
    space = make_env()
    policy = DiscreteActorPolicy(actor=MaskedActor(), action_space=space.action_space,
                                 observation_space=space.observation_space)
    algorithm = PPO(policy=policy, critic=Critic(), optim=AdamOptimizerFactory(lr=3e-4), eps_clip=0.2,
                    ent_coef=0.01, vf_coef=0.5, max_grad_norm=0.5, gae_lambda=0.95, gamma=0.99)
    collect = 1024
    collector = Collector(algorithm, envs, VectorReplayBuffer(collect, N_ENVS))

    def act(obs: dict[str, np.ndarray], call_mask: np.ndarray) -> int:
        batch = Batch(obs=Batch(obs=obs["obs"][None], mask=obs["mask"][None]), info=Batch())
        with torch.no_grad():
            return int(policy(batch).act[0])  # sampled: deterministic_eval is off

    before = evaluate(act, layout="tianshou")
    with Timer() as t:
        stats = algorithm.run_training(OnPolicyTrainerParams(
            training_collector=collector, max_epochs=1, epoch_num_steps=args.steps,
            collection_step_num_env_steps=collect, update_step_num_repetitions=10, batch_size=256,
            test_collector=None, verbose=False, show_progress=False))
    after = evaluate(act, layout="tianshou")
    report("tianshou_ppo", int(stats.train_step), t.seconds, before, after, seed=args.seed)


if __name__ == "__main__":  # SubprocVectorEnv / ShmemVectorEnv start worker processes: keep this guard
    main()
