"""Running task code: bounded and judged by value (:mod:`.cases`, a standard-library leaf), cached and
dispatched (:mod:`.runner`), and contained in a child process for task packs (:mod:`.sandbox`,
:mod:`.sandbox_child`). BugFix-v1's tests: its cases, value codec and judges (:mod:`.repair_cases`, a leaf
too), the persistent contained worker (:mod:`.worker`, :mod:`.worker_child`) and the judged, cached entry
point :func:`.repair_runner.run_repair_tests`.

``bugfix_gym.execution.run_cases`` and the other names of :mod:`.cases` stay importable from here.
"""

from .cases import (  # noqa: F401
    MAX_LOOP_TICKS, Case, LoopBudgetExceeded, Outcome, TestReport, call_one, compile_function, error_name,
    format_call, is_plain, judge, judge_one, run_cases, safe_name, same_value,
)
