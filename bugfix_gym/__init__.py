"""bugfix-gym: repair small buggy Python functions with text tool calls.

``import bugfix_gym`` registers ``BugFix-v0`` and ``BugFix-v1``; ``gym.make("bugfix_gym:BugFix-v0")`` imports
this package by itself (gymnasium >= 1.0 has no entry-point plugins).
"""

import importlib
import importlib.abc
import importlib.util
import sys

from gymnasium.envs.registration import register as _register
from gymnasium.envs.registration import registry as _registry

from .core.env import BugFixEnv, CHARSET
from .core.evaluation import episode_stats, evaluate
from .tasks.generator import generate_tasks
from .edits.ops import DEFECTS, FIX_OPS, apply_op, inject_defect
from .core.scripted import scripted_policy
from .tasks.library import Task, get_task, make_tasks
from .core.vocabulary import Tokenizer, build_tokenizer, fixed_tokenizer
from .contract.tokens import OWNER_PAD, OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, encode_segment, episode_tokens
from .core.tools import CALLS, parse_call
from .integrations import hf_tokenizer as _hf_tokenizer  # noqa: F401 (registers the chat-template tokenizer format)
from .contract import byte_tokenizer as _byte_tokenizer  # noqa: F401 (registers the byte tokenizer format)
from .contract import bpe_tokenizer as _bpe_tokenizer  # noqa: F401 (registers the BPE tokenizer format)

__version__ = "0.1.0"

# BugFixEnv in the wrappers (bugfix_gym.views.text_wrappers) that its options statement_dropout, ... ask for
_register(id="BugFix-v0", entry_point="bugfix_gym.views.text_wrappers:make_bugfix_env")
# BugFix-v1: real functions, injected bug classes, sited edits and line patches (bugfix_gym.core.env_v1). It is
# another env beside v0, not v0's next version: gymnasium would call every gym.make("BugFix-v0") "out of date" (a
# DeprecationWarning, an error under -W error), and make("BugFix") would start giving v1. Its spec's family name is
# its own, so gymnasium's version lookup for "BugFix" sees v0 only; make("BugFix-v1") finds it by id as usual.
_register(id="BugFix-v1", entry_point="bugfix_gym.core.env_v1:BugFixEnvV1")
_registry["BugFix-v1"].name = "BugFixV1"
_register(id="LookThenAnswer-v0", entry_point="bugfix_gym.core.look:LookThenAnswerEnv")
# the array views (bugfix_gym.views.wrappers), for libraries that build envs from an id (TorchRL GymEnv, SB3, RLlib)
_register(id="BugFixCalls-v0", entry_point="bugfix_gym.views.wrappers:make_discrete_calls")
_register(id="BugFixTokens-v0", entry_point="bugfix_gym.views.wrappers:make_token_observation")
# BugFix-v1's array views (bugfix_gym.views.heads_v1): factorised masked heads, and byte tokens; family names of
# their own for the same reason as BugFix-v1's (else every make of a v0 view warns that it is out of date)
_register(id="BugFixCalls-v1", entry_point="bugfix_gym.views.heads_v1:make_factorised_calls")
_registry["BugFixCalls-v1"].name = "BugFixCallsV1"
_register(id="BugFixTokens-v1", entry_point="bugfix_gym.views.heads_v1:make_byte_token_calls")
_registry["BugFixTokens-v1"].name = "BugFixTokensV1"


MOVED = {
    "env": "core.env", "tools": "core.tools", "evaluation": "core.evaluation", "scripted": "core.scripted",
    "look": "core.look", "tokenizer": "core.vocabulary", "tokens": "contract.tokens", "spaces": "contract.spaces",
    "text_safety": "contract.text", "runner": "execution.runner", "sandbox": "execution.sandbox",
    "sandbox_child": "execution.sandbox_child", "ops": "edits.ops", "book_tasks": "tasks.book_tasks",
    "templates": "tasks.templates", "generator": "tasks.generator", "packs": "tasks.packs",
    "saved_state": "core.saved_state", "wrappers": "views.wrappers", "text_wrappers": "views.text_wrappers",
    "play": "views.play",
}
"""The modules of the flat layout (before the sub-packages) -> where they live now. ``import bugfix_gym.env``,
``bugfix_gym.sandbox.ALLOW_ROOT_PLAIN = True`` and ``python -m bugfix_gym.play`` keep working: the old name
is the new module itself, not a copy. (``bugfix_gym.tasks`` and ``bugfix_gym.execution`` are packages of
the same names that re-export what the modules had.)"""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import ``bugfix_gym.<old>`` as the module :data:`MOVED` names (``python -m`` too)."""

    def find_spec(self, fullname, path=None, target=None):
        package, _, old = fullname.rpartition(".")
        if package != __name__ or old not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self)

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name.rpartition('.')[2]]}")

    def exec_module(self, module):
        pass  # already executed under its own name

    def get_code(self, fullname):  # what ``python -m bugfix_gym.<old>`` runs: the new module as __main__
        new = f"{__name__}.{MOVED[fullname.rpartition('.')[2]]}"
        return compile(f"import runpy\nrunpy.run_module({new!r}, run_name='__main__', alter_sys=True)\n",
                       f"<{fullname} moved to {new}>", "exec")


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.append(_MovedModules())


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
    # Task packs load lazily, so ``python -m bugfix_gym.tasks.packs`` does not import itself twice.
    if name in ("TaskPackError", "load_task_pack"):
        from .tasks import packs

        return getattr(packs, name)
    if name in MOVED:  # bugfix_gym.tokenizer.X without importing bugfix_gym.tokenizer first, as before
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module 'bugfix_gym' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__all__ = [
    "BugFixEnv", "CALLS", "CHARSET", "DEFECTS", "FIX_OPS", "OWNER_PAD", "OWNER_POLICY", "OWNER_PROMPT",
    "OWNER_TOOL", "Task", "TaskPackError", "Tokenizer", "apply_op", "build_tokenizer",
    "encode_segment", "episode_stats", "episode_tokens", "evaluate", "fixed_tokenizer", "generate_tasks", "get_task",
    "inject_defect", "load_task_pack", "make_tasks", "parse_call", "scripted_policy",
]
