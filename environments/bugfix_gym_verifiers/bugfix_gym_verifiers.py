"""BugFix as a verifiers environment package, for ``vf-eval bugfix_gym_verifiers``.

verifiers' loader imports a taskset id as a top-level module and reads its ``__all__`` (the ``Taskset``,
``Harness`` and ``Env`` subclasses); this module re-exports them from
:mod:`bugfix_gym.integrations.verifiers`, where they are defined.
"""

from bugfix_gym.integrations.verifiers import BugFixHarness, BugFixTaskset, BugFixVfEnv, load_environment

__all__ = ["BugFixTaskset", "BugFixVfEnv", "BugFixHarness", "load_environment"]
