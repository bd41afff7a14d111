"""Every generator template x defect: how often a draw passes the generator's checks, and how often the
visible tests expose the bug (so `test` is informative). Run: .venv/bin/python research/check_templates.py"""
from __future__ import annotations

import sys

import numpy as np

from bugfix_gym.execution import run_tests
from bugfix_gym.generator import TEMPLATES, make_task
from bugfix_gym.tasks import task_problems

bad = 0
for split, templates in TEMPLATES.items():
    keys = [t.key for t in templates]
    assert len(keys) == len(set(keys)), "duplicate keys"
    for t in templates:
        for op in t.ops:
            rng = np.random.default_rng(0)
            ok = exposed = err = 0
            for _ in range(40):
                try:
                    task = make_task(t, op, rng, split)
                except Exception as e:  # noqa: BLE001
                    err += 1
                    last = repr(e)
                    continue
                if not task_problems(task):
                    ok += 1
                    exposed += not run_tests(task, task.source, "visible").ok
            flag = "" if ok >= 30 and err == 0 else "  <-- CHECK"
            bad += bool(flag)
            print(f"{split:8s} {t.key:22s} {op:15s} ok {ok:2d}/40 err {err} visible-exposes {exposed:2d}/{max(ok,1)}{flag}"
                  + (f" {last}" if err else ""))
print("templates:", {k: len(v) for k, v in TEMPLATES.items()}, "flagged:", bad)
sys.exit(1 if bad else 0)
