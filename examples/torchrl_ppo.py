"""Train TorchRL's masked PPO on BugFix-v0: ``GymEnv`` + ``ActionMask`` + ``MaskedCategorical``.

TorchRL builds the vector env from the id (``GymEnv("BugFixCalls-v0", num_envs=4)``, one
subprocess per env), reads the view's fixed-shape info with its default reader, and the
``ActionMask`` transform keeps the action spec's mask in step with the bool ``action_mask``
key. The actor samples from ``MaskedCategorical`` over the nine calls; ``ClipPPOLoss`` and
``GAE`` are TorchRL's own. The networks are MLPs over the token ids and owner codes, as
SB3's ``MultiInputPolicy`` uses.

    python examples/torchrl_ppo.py [--frames 20000] [--seed 0]

Figures (pass rate before -> after, run time) are in docs/interop.md. Writes only
``runs/interop/torchrl_ppo.json``.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer, SamplerWithoutReplacement
from torchrl.envs import ActionMask, ExplorationType, GymEnv, TransformedEnv, set_exploration_type
from torchrl.modules import MaskedCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss
from torchrl.objectives.value import GAE

from interop_common import ENV_ID, MAX_LEN, Timer, evaluate, report, set_threads

N_CALLS = 9


class TokenMLP(nn.Module):
    """MLP over the token view: ``ids`` and ``owner`` [B, max_len] each -> [B, out].

    :param max_len: the view's padded length
    :param out: output size (9 call logits, or 1 value)
    """

    def __init__(self, max_len: int, out: int, hidden: int = 64):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(2 * max_len, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh(),
                                 nn.Linear(hidden, out))

    def forward(self, ids: torch.Tensor, owner: torch.Tensor) -> torch.Tensor:
        x = torch.cat([ids, owner], dim=-1).float()  # [B, 2 * max_len]
        return self.net(x)  # [B, out]


def make_env(num_envs: int, seed: int) -> TransformedEnv:
    env = TransformedEnv(GymEnv(ENV_ID, num_envs=num_envs, max_len=MAX_LEN, categorical_action_encoding=True),
                         ActionMask())
    env.set_seed(seed)
    return env


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=20_000, help="environment steps (default: 20000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_threads()
    torch.manual_seed(args.seed)

    env = make_env(num_envs=4, seed=args.seed)
    actor = ProbabilisticActor(
        TensorDictModule(TokenMLP(MAX_LEN, N_CALLS), in_keys=["ids", "owner"], out_keys=["logits"]),
        in_keys={"logits": "logits", "mask": "action_mask"},  # MaskedCategorical(logits=..., mask=...)
        distribution_class=MaskedCategorical, spec=env.action_spec, return_log_prob=True)
    critic = ValueOperator(TokenMLP(MAX_LEN, 1), in_keys=["ids", "owner"])
    gae = GAE(gamma=0.99, lmbda=0.95, value_network=critic, average_gae=True)
    loss_fn = ClipPPOLoss(actor, critic, clip_epsilon=0.2, entropy_coeff=0.01, critic_coeff=0.5,
                          loss_critic_type="l2")
    optim = torch.optim.Adam(loss_fn.parameters(), lr=3e-4)

    frames_per_batch, minibatch, epochs = 1024, 256, 4
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=args.frames)
    buffer = ReplayBuffer(storage=LazyTensorStorage(frames_per_batch), sampler=SamplerWithoutReplacement(),
                          batch_size=minibatch)

    def act(obs: dict[str, np.ndarray], call_mask: np.ndarray) -> int:
        td = TensorDict({"ids": torch.as_tensor(obs["ids"]), "owner": torch.as_tensor(obs["owner"]),
                         "action_mask": torch.as_tensor(obs["action_mask"])}, batch_size=[])
        with torch.no_grad(), set_exploration_type(ExplorationType.RANDOM):
            return int(actor(td)["action"])

    before = evaluate(act)
    frames = 0
    with Timer() as t:
        for batch in collector:  # [num_envs, frames_per_batch // num_envs]
            frames += batch.numel()
            for _ in range(epochs):
                with torch.no_grad():
                    gae(batch)  # advantage and value_target with the current critic
                buffer.extend(batch.reshape(-1))
                for _ in range(frames_per_batch // minibatch):
                    losses = loss_fn(buffer.sample())
                    loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
                    optim.zero_grad()
                    loss.backward()
                    nn.utils.clip_grad_norm_(loss_fn.parameters(), 0.5)
                    optim.step()
    collector.shutdown()
    env.close()
    after = evaluate(act)
    report("torchrl_ppo", frames, t.seconds, before, after, seed=args.seed)


if __name__ == "__main__":  # GymEnv(num_envs=...) starts subprocess workers: this guard is required
    main()
