"""bugfix-gym: repair small buggy Python functions with text tool calls.

``import bugfix_gym`` registers ``BugFix-v0``; ``gym.make("bugfix_gym:BugFix-v0")`` imports
this package by itself (gymnasium >= 1.0 has no entry-point plugins).
"""

from gymnasium.envs.registration import register as _register

from .env import BugFixEnv, CHARSET
from .evaluation import episode_stats, evaluate
from .generator import generate_tasks
from .ops import DEFECTS, FIX_OPS, apply_op, inject_defect
from .scripted import scripted_policy
from .tasks import Task, get_task, make_tasks
from .tokenizer import Tokenizer, build_tokenizer, fixed_tokenizer
from .tokens import OWNER_PAD, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, encode_segment, episode_tokens
from .tools import CALLS, parse_call

__version__ = "0.1.0"

# BugFixEnv in the wrappers (bugfix_gym.text_wrappers) that its options statement_dropout, inert_lines, ... ask for
_register(id="BugFix-v0", entry_point="bugfix_gym.text_wrappers:make_bugfix_env")
_register(id="LookThenAnswer-v0", entry_point="bugfix_gym.look:LookThenAnswerEnv")
# the array views (bugfix_gym.wrappers), for libraries that build envs from an id (TorchRL GymEnv, SB3, RLlib)
_register(id="BugFixCalls-v0", entry_point="bugfix_gym.wrappers:make_discrete_calls")
_register(id="BugFixTokens-v0", entry_point="bugfix_gym.wrappers:make_token_observation")


def _preload_in_forkserver() -> None:
    """Import this package in multiprocessing's forkserver too, so the subprocesses of SB3's
    ``SubprocVecEnv`` (forkserver by default on Linux) know ``"BugFix-v0"`` without any glue.
    Only takes effect before the forkserver starts; the spawn method re-imports ``__main__``,
    which imports this package itself."""
    import multiprocessing
    from multiprocessing import forkserver

    current = list(getattr(forkserver._forkserver, "_preload_modules", ["__main__"]))
    if __name__ not in current:
        multiprocessing.set_forkserver_preload([*current, __name__])


_preload_in_forkserver()


def __getattr__(name: str):
    # Task packs load lazily, so ``python -m bugfix_gym.packs`` does not import itself twice.
    if name in ("TaskPackError", "load_task_pack"):
        from . import packs

        return getattr(packs, name)
    raise AttributeError(f"module 'bugfix_gym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BugFixEnv", "CALLS", "CHARSET", "DEFECTS", "FIX_OPS", "OWNER_PAD", "OWNER_POLICY", "OWNER_PROMPT",
    "OWNER_TOOL", "Task", "TaskPackError", "Tokenizer", "apply_op", "build_tokenizer",
    "encode_segment", "episode_stats", "episode_tokens", "evaluate", "fixed_tokenizer", "generate_tasks", "get_task",
    "inject_defect", "load_task_pack", "make_tasks", "parse_call", "scripted_policy",
]
