"""Train RLlib's PPO with action masking on BugFix-v0 (``BugFixCalls-v0``, ``layout="rllib"``).

RLlib builds the vector env from the id (``"bugfix_gym:BugFixCalls-v0"``, which imports the
package in every worker) with ``env_config`` as the ``gym.make`` arguments. The ``"rllib"``
layout gives ``{"observations": tokens, "action_mask": call mask}``, the form RLlib's
action-masking RLModule (``ActionMaskingTorchRLModule``, shipped in RLlib's examples)
reads: it hands ``observations`` to the default PPO encoder (an MLP) and adds log(mask) to
the logits.

ray[rllib] pins its own gymnasium, so this runs in its own virtual environment:

    make rllib            # builds .venv-rllib from constraints-rllib.txt and runs this
    .venv-rllib/bin/python examples/rllib_ppo.py [--iterations 20] [--seed 0]

Figures (pass rate before -> after, run time) are in docs/interop.md. Writes only under
``runs/interop/`` (the result, RLlib's logs and Ray's session files).
"""

from __future__ import annotations

import argparse

import numpy as np
import ray
import ray.tune.trainable.trainable as ray_trainable
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.examples.rl_modules.classes.action_masking_rlm import ActionMaskingTorchRLModule

from interop_common import ENV_ID, MAX_LEN, RUNS, Timer, evaluate, report, set_threads


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20, help="PPO iterations of 1024 env steps (default: 20)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_threads()

    RUNS.mkdir(parents=True, exist_ok=True)
    ray_trainable.DEFAULT_STORAGE_PATH = str((RUNS / "rllib").resolve())  # RLlib's logs: not ~/ray_results
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             _temp_dir=str((RUNS / "ray").resolve()))  # Ray's session files: not /tmp/ray
    config = (
        PPOConfig()
        .environment(f"bugfix_gym:{ENV_ID}", env_config={"max_len": MAX_LEN, "layout": "rllib"})
        .env_runners(num_env_runners=0, num_envs_per_env_runner=8)  # sample in this process: 2 cores
        .training(train_batch_size_per_learner=1024, minibatch_size=256, num_epochs=10, lr=3e-4,
                  entropy_coeff=0.01, vf_loss_coeff=0.5, clip_param=0.2, gamma=0.99, lambda_=0.95)
        .rl_module(rl_module_spec=RLModuleSpec(module_class=ActionMaskingTorchRLModule,
                                               model_config={"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"}))
        .debugging(seed=args.seed)
    )
    algo = config.build_algo()
    module = algo.get_module()

    def act(obs: dict[str, np.ndarray], call_mask: np.ndarray) -> int:
        batch = {"obs": {"observations": torch.as_tensor(obs["observations"])[None],
                         "action_mask": torch.as_tensor(obs["action_mask"])[None]}}
        with torch.no_grad():
            logits = module.forward_exploration(batch)["action_dist_inputs"]  # [1, 9], masked
        return int(torch.distributions.Categorical(logits=logits).sample()[0])

    before = evaluate(act, layout="rllib")
    steps = 0
    with Timer() as t:
        for _ in range(args.iterations):
            result = algo.train()
            steps = int(result["num_env_steps_sampled_lifetime"])
    after = evaluate(act, layout="rllib")
    algo.stop()
    ray.shutdown()
    report("rllib_ppo", steps, t.seconds, before, after, seed=args.seed)


if __name__ == "__main__":  # Ray starts worker processes: keep this guard
    main()
