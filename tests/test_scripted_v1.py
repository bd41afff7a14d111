"""BugFix-v1's baselines: valid calls only, deterministic per seed, the debugger blind to the answer, brute force
finding a one-edit repair, the debugger's prior counted from the train split only."""

from __future__ import annotations

from collections import Counter

import pytest

from bugfix_gym.core import scripted_v1
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.locate import locate_text
from bugfix_gym.core.scripted_v1 import (KINDS_V1, brute_force_order, debugger_order, locate_scores, make_policy,
                                         play_episode)
from bugfix_gym.execution.repair_cases import CallCase
from bugfix_gym.tasks.problems import RepairTask

BUGGY = "def add_one(xs):\n    return [x - 1 for x in xs]\n"
FIXED = "def add_one(xs):\n    return [x + 1 for x in xs]\n"
VISIBLE = (CallCase(([1, 2],), [2, 3]),)
HIDDEN = (*VISIBLE, CallCase(([],), []), CallCase(([5, -1],), [6, 0]))


class _Bug:
    repair = "edit 2.2 op +"


def _task(name: str = "add_one~0") -> RepairTask:
    return RepairTask(name, "add_one", "add one to each number", BUGGY, "", VISIBLE, HIDDEN, "test", "pack",
                      "pack/add_one", fixed_source=FIXED, bugs=(_Bug(),))


class _Sealed(RepairTask):
    """A task whose answer (``bugs``, ``fixed_source``) raises on any read."""

    def __getattribute__(self, name: str):
        if name in ("bugs", "fixed_source"):
            raise AssertionError(f"task.{name} was read")
        return object.__getattribute__(self, name)


class _Checked(scripted_v1.PolicyV1):
    """Wraps a policy: every call it makes must be in ``legal()`` (or be ``submit``); records the calls."""

    def __init__(self, inner: scripted_v1.PolicyV1) -> None:
        self.inner, self.calls = inner, []

    def reset(self, seed: int) -> None:
        self.inner.reset(seed)

    def __call__(self, observation, info, legal):
        call = self.inner(observation, info, legal)
        assert call == "submit" or call in legal(), call
        self.calls.append(call)
        return call


def test_the_repair_is_a_legal_call_of_the_buggy_source():
    env = BugFixEnvV1(tasks=[_task()])
    env.reset(seed=0, options={"task": "add_one~0"})
    assert _Bug.repair in env.legal_calls()


@pytest.mark.parametrize("kind", KINDS_V1)
def test_each_baseline_plays_legal_calls_only_within_the_budget(kind):
    task = _task()
    env = BugFixEnvV1(tasks=[task], max_turns=12)
    policy = _Checked(make_policy(kind, [task], max_turns=12))
    for seed in (0, 1):
        episode = play_episode(env, policy, task.name, seed=seed)
        assert episode.invalid == 0 and 1 <= episode.calls <= 12
        assert episode.stop in ("submit", "budget")
    if kind in ("oracle", "debugger"):  # brute force's 25th try is the repair: past this budget
        assert episode.passed and episode.reward == 1.0 and policy.calls[-1] == "submit"


@pytest.mark.parametrize("kind", KINDS_V1)
def test_each_baseline_is_deterministic_per_seed(kind):
    task = _task()
    env = BugFixEnvV1(tasks=[task])
    runs = []
    for seed in (3, 3, 4):
        policy = _Checked(make_policy(kind, [task]))
        episode = play_episode(env, policy, task.name, seed=seed)
        runs.append((policy.calls, episode))
    assert runs[0] == runs[1]
    if kind == "random":
        assert runs[0][0] != runs[2][0]  # another seed, other draws (over ~100 legal calls a turn)


def test_the_debugger_never_reads_the_answer():
    fields = ("name", "entry", "statement", "source", "support", "visible", "hidden", "split", "origin", "problem")
    task = _Sealed(**{f: getattr(_task(), f) for f in fields})
    env = BugFixEnvV1(tasks=[task])
    for kind in ("debugger", "brute_force", "random"):
        policy = _Checked(make_policy(kind, max_turns=12))
        episode = play_episode(env, policy, task.name, seed=0)
        assert episode.invalid == 0
    assert episode.calls >= 1
    debugger = _Checked(make_policy("debugger"))
    assert play_episode(env, debugger, task.name).passed
    assert debugger.calls[:3] == ["read", "test", "locate"] and debugger.calls[-2:] == ["test", "submit"]
    with pytest.raises(AssertionError, match="task.bugs was read"):
        make_policy("oracle", [task])  # the oracle reads the answer, so the sealed task stops it


def test_unbounded_brute_force_finds_a_one_edit_repair_and_counts_its_tests():
    task = _task()
    env = BugFixEnvV1(tasks=[task], max_turns=100_000)
    env.reset(seed=0, options={"task": task.name})
    order = brute_force_order(env.legal_calls())
    policy = _Checked(make_policy("brute_force", max_turns=None))
    episode = play_episode(env, policy, task.name)
    assert episode.passed and episode.invalid == 0
    tried = [c for c in policy.calls if c.startswith(("edit ", "delete "))]
    assert tried == order[:len(tried)]  # the documented order, nothing skipped
    assert episode.test_calls == len(tried) <= order.index(_Bug.repair) + 1
    assert policy.calls[-2:] == ["test", "submit"]
    assert episode.calls == 1 + 3 * (len(tried) - 1) + 2 + 1  # read, (edit test revert)*, edit test, submit


def test_brute_force_stops_at_the_budget():
    task = _task()
    env = BugFixEnvV1(tasks=[task], max_turns=12)
    env.reset(seed=0, options={"task": task.name})
    if brute_force_order(env.legal_calls()).index(_Bug.repair) < 3:
        pytest.skip("the repair is among the first three tries")
    policy = _Checked(make_policy("brute_force", max_turns=12))
    episode = play_episode(env, policy, task.name)
    assert not episode.passed and episode.calls <= 12 and policy.calls[-1] == "submit"
    assert policy.calls[:4] == ["read", brute_force_order(env.legal_calls())[0], "test", "revert"]


def test_the_tools_text_is_read_as_printed():
    assert scripted_v1.tests_passed("visible tests : 2 / 2 passed")
    assert not scripted_v1.tests_passed("visible tests : 1 / 2 passed . x")
    assert not scripted_v1.tests_passed("hidden tests passed : 3 / 3")
    text = locate_text((False, True, False), (frozenset({2, 4}), frozenset({2}), frozenset({2, 4, 5})), None)
    assert locate_scores(text) == {4: 1.0, 5: 0.71, 2: 0.82}
    assert locate_scores("all 2 visible tests pass : no failing test to locate from") == {}


def test_debugger_order_tries_the_suspicious_lines_first_then_the_prior():
    legal = ["read", "edit 2.1 op -", "edit 3.1 name n0", "edit 3.1 unwrap c0", "delete 2", "submit"]
    order = debugger_order(legal, {3: 1.0})
    assert set(order) == {"edit 2.1 op -", "edit 3.1 name n0", "edit 3.1 unwrap c0", "delete 2"}
    assert set(order[:2]) == {"edit 3.1 name n0", "edit 3.1 unwrap c0"}
    prior = scripted_v1.mutation_prior()
    assert (order[0] == "edit 3.1 unwrap c0") == (prior[("unwrap", "c0")] > prior[("name", "n0")])


def test_the_prior_is_counted_from_the_train_split_only(monkeypatch):
    from bugfix_gym.tasks import humaneval
    from bugfix_gym.tasks.mutants import stored_tasks

    real = humaneval.humaneval_problems

    def train_only(split="all"):
        if split != "train":
            raise AssertionError(f"the prior read the {split} split")
        return real("train")[:1]

    monkeypatch.setattr(humaneval, "humaneval_problems", train_only)
    counts = scripted_v1.prior_counts()
    tasks = stored_tasks(real("train")[:1], bugs=1)
    assert counts["split"] == "train" and counts["tasks"] == len(tasks) > 0
    assert sum(n for _, _, n in counts["repairs"]) == len(tasks)
    want = Counter(scripted_v1._kind_and_arg(bug.repair) for task in tasks for bug in task.bugs)
    assert {(k, a): n for k, a, n in counts["repairs"]} == want


def test_the_committed_prior_is_the_train_split_s():
    from importlib import resources
    import json

    from bugfix_gym.tasks.humaneval import humaneval_problems
    from bugfix_gym.tasks.mutants import stored_tasks

    data = json.loads(resources.files("bugfix_gym.tasks").joinpath("data", scripted_v1.PRIOR_FILE).read_text())
    assert data["split"] == "train" and data["tasks"] == len(stored_tasks(humaneval_problems("train"), bugs=1))
    assert sum(n for _, _, n in data["repairs"]) == data["tasks"]


@pytest.mark.slow
def test_the_committed_prior_is_what_the_train_split_counts():
    assert scripted_v1.main(["--check"]) == 0


def test_make_policy_refuses_an_unknown_kind():
    with pytest.raises(ValueError, match="unknown baseline 'greedy'; use one of oracle, brute_force"):
        make_policy("greedy")


def test_the_baselines_benchmark_runs_a_bounded_table(tmp_path, capsys):
    import importlib.util
    import json
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "baselines_v1.py"
    spec = importlib.util.spec_from_file_location("benchmark_baselines_v1", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "b.json"
    assert bench.main(["--splits", "test", "--bugs", "1", "--limit", "2", "--baselines", "oracle",
                       "--unbounded", "0", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert set(data["rows"]) == {"test|1|oracle|12 turns"} and len(data["episodes"]["test|1|oracle|12 turns"]) == 2
    row = data["rows"]["test|1|oracle|12 turns"]
    assert row["tasks"] == 2 and row["pass_rate"] == 1.0 and row["mean_calls"] == 3.0  # read, the repair, submit
    assert capsys.readouterr().out.splitlines()[2].split()[:6] == ["test", "1", "oracle", "12", "turns", "2"]
    merged = bench.merge([str(out), str(out)], str(tmp_path / "m.json"))  # a task counts once per group
    assert merged["rows"]["test|1|oracle|12 turns"] == row
