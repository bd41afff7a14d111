"""Task sources: the :class:`~.library.Task` type and the book's library (:mod:`.library`,
:mod:`.book_tasks`), the procedural generator (:mod:`.generator`, :mod:`.templates`), user task packs
(:mod:`.packs`).

``bugfix_gym.tasks.Task``, ``make_tasks``, ``get_task`` and the other names of :mod:`.library` stay
importable from here.
"""

from .library import (  # noqa: F401
    REGISTRY, SPLITS, Task, correct_source, get_task, make_tasks, name_taken, register, task_from_correct,
    task_problems, task_to_data,
)
