"""Smoke runs of the benchmarks in ``make bench`` with tiny settings, so none can break silently
(the figures themselves are measured by ``make bench``; docs/ has them). ppo_update, reinforce_step
and scale_out take tens of seconds even at their smallest and are left to ``make bench``."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys
from types import ModuleType

import pytest

BENCHMARKS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"benchmark_{name}", BENCHMARKS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("argv", [["--repeats", "2", "--batch", "2", "--foresight", "0.5"], ["--batch", "2"]])
def test_sampling_runs_every_path_more_than_once(argv, shared_base_agent, capsys):
    """Each repeat samples again with the same samplers: the no-cache model's second batch reuses
    its sampler (once an AttributeError on the prefix cache)."""
    out = _load("sampling").main(argv)
    expected = {"sampling_over_forward", "cache_speedup"}
    if "--foresight" in argv:
        expected.add("foresight_over_grammar")
    assert set(out) == expected and all(math.isfinite(v) and v > 0 for v in out.values())
    assert "KV cache speed-up over re-running the prefix" in capsys.readouterr().out


def test_env_throughput_runs():
    out = _load("env_throughput").main(["--steps", "50", "--repeats", "1"])
    assert out and all(math.isfinite(v) and v > 0 for v in out.values() if isinstance(v, float))


def test_sandbox_overhead_runs():
    out = _load("sandbox_overhead").main(["--rounds", "1"])
    assert out and all(math.isfinite(v) and v > 0 for v in out.values())


def test_snippet_threads_times_the_documents_first_block():
    bench = _load("snippet_threads")
    readme = bench.first_python_block(bench.ROOT / "README.md")
    assert readme.startswith("import gymnasium as gym") and "TokenPPO" in readme
    wall, cpu = bench.time_block("x = 1", "default", timeout=120)
    assert 0 < wall < 120 and cpu >= 0
    assert bench.time_block("import time; time.sleep(5)", "default", timeout=0.5)[0] == math.inf
