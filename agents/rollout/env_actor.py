"""EnvActor: one environment behind method calls, the process-side half of :class:`agents.RayVecEnv`.

Kept apart from ``ray_vec_env`` so that an actor's process imports only gymnasium and the
env's own code, not Stable-Baselines3 and torch (whose import would dominate an actor's
start-up); it has no Ray import either, so it can be tested as a plain object.

An actor knows no env package: it first imports the packages it is given (``RayVecEnv`` passes
those that registered the driver's env ids, :func:`registering_packages`), so an ``env_fn`` may make
an env by its plain id (``gym.make("BugFix-v0")``) as in the driver.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import Any

import gymnasium as gym


def registering_packages() -> list[str]:
    """The top-level packages, other than Gymnasium's own, whose import registered an env id in this
    process (``import bugfix_gym`` registers ``BugFix-v0``): what another process must import to make
    the same ids."""
    found = set()
    for spec in gym.registry.values():
        entry = spec.entry_point
        module = entry.split(":")[0] if isinstance(entry, str) else getattr(entry, "__module__", "") or ""
        found.add(module.split(".")[0])
    return sorted(found - {"", "gymnasium", "ale_py", "shimmy", "__main__"})


class EnvActor:
    """One environment and the commands of SB3's ``SubprocVecEnv`` worker, as methods.

    :param env_fn: returns a new environment; called once, in the actor's process
    :param packages: modules to import first (those that register the env ids ``env_fn`` may use)
    """

    def __init__(self, env_fn: Callable[[], gym.Env], packages: Sequence[str] = ()):
        for package in packages:
            importlib.import_module(package)
        env = env_fn()
        if not isinstance(env, gym.Env):  # an old-gym / shimmy env: SB3 converts it
            from stable_baselines3.common.vec_env.patch_gym import _patch_env

            env = _patch_env(env)
        self.env = env
        self.reset_info: dict[str, Any] = {}

    def spaces(self) -> tuple[gym.spaces.Space, gym.spaces.Space]:
        return self.env.observation_space, self.env.action_space

    def step(self, action: Any) -> tuple[Any, float, bool, dict[str, Any], dict[str, Any]]:
        """One step in SB3's ``VecEnv`` convention: ``done``, and a reset at the episode's end.

        :return: observation (the next episode's first one after a reset), reward, done,
            info (with ``terminal_observation`` and ``TimeLimit.truncated``), latest reset info
        """
        observation, reward, terminated, truncated, info = self.env.step(action)
        done = terminated or truncated
        info["TimeLimit.truncated"] = truncated and not terminated
        if done:
            info["terminal_observation"] = observation
            observation, self.reset_info = self.env.reset()
        return observation, float(reward), done, info, self.reset_info

    def reset(self, seed: int | None, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        maybe_options = {"options": options} if options else {}
        observation, self.reset_info = self.env.reset(seed=seed, **maybe_options)
        return observation, self.reset_info

    def render(self) -> Any:
        return self.env.render()

    def close(self) -> None:
        self.env.close()

    def env_method(self, name: str, args: tuple, kwargs: dict[str, Any]) -> Any:
        return self.env.get_wrapper_attr(name)(*args, **kwargs)

    def get_attr(self, name: str) -> Any:
        return self.env.get_wrapper_attr(name)

    def has_attr(self, name: str) -> bool:
        try:
            self.env.get_wrapper_attr(name)
        except AttributeError:
            return False
        return True

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.env, name, value)

    def is_wrapped(self, wrapper_class: type[gym.Wrapper]) -> bool:
        from stable_baselines3.common.env_util import is_wrapped

        return is_wrapped(self.env, wrapper_class)
