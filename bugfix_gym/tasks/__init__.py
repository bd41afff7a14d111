"""Task sources: the :class:`~.library.Task` type and the book's library (:mod:`.library`,
:mod:`.book_tasks`), the procedural generator (:mod:`.generator`, :mod:`.templates`), user task packs
(:mod:`.packs`, what both formats share in :mod:`.pack_files`, v1's in :mod:`.packs_v1`).

BugFix-v1's sources are :class:`~.problems.Problem` s (a correct function and its tests) and
:class:`~.problems.RepairTask` s: the HumanEval problems (:mod:`.humaneval`, split by
:mod:`.humaneval_split` into committed data), v0's book tasks and templates (:mod:`.v0_sources`) and v1 packs;
:mod:`.literal_cases` turns literal test statements into cases.

``bugfix_gym.tasks.Task``, ``make_tasks``, ``get_task`` and the other names of :mod:`.library` stay
importable from here.
"""

from .library import (  # noqa: F401
    REGISTRY, SPLITS, Task, correct_source, get_task, make_tasks, name_taken, register, task_from_correct,
    task_problems, task_to_data,
)
