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
    expected = {"sampling_over_forward", "grammar_over_forward", "cache_speedup"}
    if "--foresight" in argv:
        expected.add("foresight_over_grammar")
    assert set(out) == expected and all(math.isfinite(v) and v > 0 for v in out.values())
    assert "KV cache speed-up over re-running the prefix" in capsys.readouterr().out


def test_sampling_on_bugfix_v1_runs(capsys):
    out = _load("sampling").main(["--env", "BugFix-v1", "--batch", "2", "--episodes", "3", "--repeats", "1",
                                  "--v1-agent", "untrained"])
    assert set(out) == {"v1_sampling_over_forward", "v1_sampling_over_chunked_forward"}
    assert all(math.isfinite(v) and v > 0 for v in out.values())
    printed = capsys.readouterr().out
    assert "v1 grammar sampling / forward throughput" in printed and "3 episodes in 2 lockstep envs" in printed


def test_env_throughput_runs():
    out = _load("env_throughput").main(["--steps", "50", "--repeats", "1"])
    assert out and all(math.isfinite(v) and v > 0 for v in out.values() if isinstance(v, float))


def test_views_v1_runs_and_heads_in_order_play_only_legal_calls():
    out = _load("views_v1").main(["--steps", "8"])
    assert out["heads in order, head_masks(prefix)"][0] == 1.0
    assert all(0 <= share <= 1 and calls > 0 and tokens > 0 for share, calls, tokens in out.values())


def test_sandbox_overhead_runs():
    out = _load("sandbox_overhead").main(["--rounds", "1"])
    assert out and all(math.isfinite(v) and v > 0 for v in out.values())


def test_worker_overhead_runs():
    out = _load("worker_overhead").main(["--rounds", "1", "--batch", "2"])
    assert set(out) == {"in-process", "one child per call", "worker", "worker, back to back", "worker, batch of 2"}
    assert all(math.isfinite(v) and v > 0 for v in out.values())


def test_algorithm_table_statistics_by_hand():
    """The table's interval, its first-crossing step count and its rows, on records worked by hand."""
    table = _load("algorithms")
    mean, half = table.interval95([0.5, 0.7, 0.9])  # sd 0.2, t(2) = 4.303
    assert mean == pytest.approx(0.7) and half == pytest.approx(4.303 * 0.2 / math.sqrt(3))
    assert math.isnan(table.interval95([0.4])[1])
    curve = [dict(num_timesteps=100, pass_rate=0.5), dict(num_timesteps=200, pass_rate=0.8),
             dict(num_timesteps=300, pass_rate=0.9)]
    assert table.steps_to(curve) == 200 and table.steps_to(curve, 0.95) is None
    assert table.steps_to(curve + [dict(num_timesteps=320, pass_rate=1.0)], 0.95) is None  # a cut-short last batch
    never = [dict(p, pass_rate=0.5) for p in curve]
    records = [dict(protocol="book", algo="ppo", seed=s, cells={"train": t, "held-out": h}, base={"train": 0.2},
                    wall_s=10.0 * (s + 1), train_s=4.0 * (s + 1), kept_iteration=20 * s, curve=curve if s else never)
               for s, (t, h) in enumerate([(0.8, 0.6), (1.0, 0.8)])]
    text = table.table_markdown(records, "book")
    assert "| base agent | 2 | 0.200 ± 0.000 | - | - | - | - | - |" in text
    assert "| `ppo` | 2 | 0.900 ± 1.271 | 0.700 ± 1.271 | 15 | 6 | 200 (1/2) | 1/2 |" in text
    records[0].pop("kept_iteration")  # a run without validation: no count
    assert table.table_markdown(records, "book").endswith("| 200 (1/2) | - |")


def _table_rows() -> list[tuple[str, str]]:
    from agents.algorithms.presets import ALGORITHM_NAMES

    return [(protocol, algo) for protocol in ("book", "generalisation", "generalisation-100k")
            for algo in ALGORITHM_NAMES]


@pytest.mark.parametrize("protocol,algo", _table_rows())
def test_each_row_of_the_algorithm_table_trains_the_preset_it_names(protocol, algo):
    """What run.json holds for the row (the settings ``bugfix-gym train`` builds of the protocol's flags): the
    preset's settings on its class's defaults, nothing of the recipe's loss additions; the recipe's tasks,
    decoding and base agent stay."""
    import dataclasses
    import json

    from agents.algorithms.presets import get_preset
    from agents.bugfix.aux_losses import AUX_SETTINGS

    table = _load("algorithms")
    settings = table.expected_settings(protocol, algo)
    preset = get_preset(algo)
    defaults = {f.name: f.default for f in dataclasses.fields(preset.cls.config_class) if f.name != "aux_losses"}
    assert settings["ppo"] == json.loads(json.dumps(dict(defaults, **preset.settings)))
    assert settings["algo"] == algo and settings["preset_only"] is True and settings["dropped_settings"] == []
    assert not set(AUX_SETTINGS) & set(settings["ppo"])
    if protocol.startswith("generalisation"):
        assert settings["tasks"] == "generated" and settings["foresight"] is None
        assert settings["call_mask"] == "call_mask" and settings["base_agent"]["practice"] > 0  # env protocol kept
    assert table.run_dir(protocol, algo, 1).name == "seed-1"


#: what the v1 recipe may set over a preset: the batch, the learning rate, the passes and the longest call (and
#: Dr. GRPO's L_max, which they give); never the estimator, the loss, the clip range or a KL
V1_BUDGET = {"n_episodes", "learning_rate", "max_call_tokens", "n_epochs", "n_minibatches", "ent_coef",
             "loss_norm_const"}


def _algorithm_names() -> tuple[str, ...]:
    from agents.algorithms.presets import ALGORITHM_NAMES

    return tuple(ALGORITHM_NAMES)


@pytest.mark.parametrize("algo", _algorithm_names())
def test_each_v1_row_trains_its_preset_with_only_the_recipes_budget(algo):
    """run.json's settings on the v1 protocol: the preset's on its class's defaults wherever the recipe's budget
    is silent; the entropy bonus off; and a model built as the recipe builds it has exactly those settings."""
    import dataclasses
    import json

    from agents.algorithms.presets import get_preset, make_algorithm
    from agents.bugfix.recipe_v1 import RepairRecipeV1
    from agents.bugfix.repair_v1 import policy_kwargs
    from agents.bugfix.v1 import make_v1_env, v1_tokenizer
    from agents.model.tinyagent import TinyAgentConfig
    from agents.rollout.vec_env import FreshInfoDummyVecEnv

    table = _load("algorithms")
    settings = table.expected_settings("v1", algo)
    preset = get_preset(algo)
    plain = json.loads(json.dumps({f.name: f.default for f in dataclasses.fields(preset.cls.config_class)
                                   if f.name != "aux_losses"} | preset.settings))
    assert settings["algo"] == algo and settings["foresight"] is None
    assert {k: v for k, v in settings["ppo"].items() if k not in V1_BUDGET} == \
        {k: v for k, v in plain.items() if k not in V1_BUDGET}
    assert settings["ppo"].get("ent_coef", 0.0) == 0.0
    recipe = RepairRecipeV1()
    tok = v1_tokenizer(recipe.tokenizer)
    venv = FreshInfoDummyVecEnv([lambda: make_v1_env(split="train", max_turns=recipe.max_turns)])
    model = make_algorithm(algo, "TinyAgentPolicy", venv, policy_kwargs=policy_kwargs(
        tok, TinyAgentConfig(vocab_size=tok.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=1024)),
        **recipe.algorithm_settings(algo))
    built = json.loads(json.dumps({k: v for k, v in dataclasses.asdict(model.config).items()
                                   if k not in ("aux_losses", "preset")}))
    assert built == {k: v for k, v in settings["ppo"].items() if k != "preset"}
    assert table.run_dir("v1", algo, 2).name == "seed-2"


def test_the_v1_protocol_reads_a_finished_run_into_a_row(tmp_path, monkeypatch):
    """A v1 run's folder (run.json as the protocol writes it, results.json as train_v1 does) becomes a record
    with the test split's and the pack's pass rates and the base agent's, without training again."""
    import json

    table = _load("algorithms")
    monkeypatch.chdir(tmp_path)
    out = table.run_dir("v1", "grpo", 0)
    out.mkdir(parents=True)
    (out / "run.json").write_text(json.dumps(table.expected_settings("v1", "grpo", 0)))
    curve = [dict(iteration=1, num_timesteps=300, pass_rate=0.1), dict(iteration=2, num_timesteps=600, pass_rate=0.2)]
    (out / "results.json").write_text(json.dumps(dict(trained=dict(pass_rate=0.25), base=dict(pass_rate=0.125),
                                                      train_s=60.0, env_steps=600, kept_iteration=3, curve=curve)))
    asked = []
    monkeypatch.setattr(table, "_run", lambda cmd, log: asked.append(cmd) or '{"pass_rate": 0.5}\n')
    record = table.run_one("v1", "grpo", 0, None)
    assert (record["cells"], record["base"], record["timesteps"]) == ({"test": 0.25, "pack": 0.5}, {"test": 0.125}, 600)
    assert record["kept_iteration"] == 3
    older = {k: v for k, v in record.items() if k != "kept_iteration"}  # a record from before it was kept
    (out / "record.json").write_text(json.dumps(older))
    assert [r["kept_iteration"] for r in table.read_records()] == [3]  # read from results.json
    assert [c[3:5] for c in asked] == [["eval", str(out.resolve() / "tokenppo.zip")]]
    assert "BugFix-v1" in asked[0] and str(table.PACK_V1) in asked[0]
    assert "| base agent | 1 | 0.125 | - |" in table.table_markdown([record], "v1")
    assert "| `grpo` | 1 | 0.250 | 0.500 |" in table.table_markdown([record], "v1")
    (out / "run.json").write_text(json.dumps(table.expected_settings("v1", "ppo", 0)))  # another algorithm's run
    (out / "record.json").unlink()
    with pytest.raises(RuntimeError, match="other settings"):
        table.run_one("v1", "grpo", 0, None)


def test_snippet_threads_times_the_documents_first_block():
    bench = _load("snippet_threads")
    readme = bench.first_python_block(bench.ROOT / "README.md")
    assert readme.startswith("import gymnasium as gym") and "TokenPPO" in readme
    wall, cpu = bench.time_block("x = 1", "default", timeout=120)
    assert 0 < wall < 120 and cpu >= 0
    assert bench.time_block("import time; time.sleep(5)", "default", timeout=0.5)[0] == math.inf


@pytest.mark.slow
def test_algorithm_table_runs_a_cell_and_resumes_it(tmp_path, monkeypatch):
    """One tiny book run through the table's own path (a `bugfix-gym train` subprocess), read back as a record;
    asked again, the finished run is read, not rerun."""
    table = _load("algorithms")
    monkeypatch.chdir(tmp_path)
    tiny = dict(table.PROTOCOLS["book"], flags=["--tasks", "book", "--n-envs", "4", "--n-episodes", "4",
                                                "--eval-episodes", "1"])
    monkeypatch.setitem(table.PROTOCOLS, "book", tiny)
    records = table.main(["--protocol", "book", "--algos", "grpo", "--seeds", "1", "--timesteps", "40", "--jobs", "1"])
    assert [(r["algo"], r["seed"]) for r in records] == [("grpo", 0)]
    assert 0.0 <= records[0]["cells"]["train"] <= 1.0 and records[0]["curve"]
    assert "| `grpo` | 1 |" in (tmp_path / "runs" / "algorithms" / "table.md").read_text()
    (table.run_dir("book", "grpo", 0) / "tokenppo.zip").unlink()
    assert table.main(["--protocol", "book", "--algos", "grpo", "--seeds", "1", "--timesteps", "40"]) == records


@pytest.mark.heavy
def test_serve_flood_runs_and_stops_by_itself():
    out = _load("serve_flood").main(["--baseline", "3", "--flood", "40", "--procs", "1", "--threads", "4",
                                     "--slow", "3", "--deadline", "1"])
    assert out["phases"]["before"]["tally"] == {"200": 3} and sum(out["fast"].values()) == 40
    assert sum(out["slow"].values()) == 3


def test_locate_v1_runs():
    out = _load("locate_v1").main(["--limit", "4"])
    assert set(out) == {"first", "first_alone", "top3", "not_ranked"} and all(0 <= v <= 1 for v in out.values())
    assert out["first_alone"] <= out["first"] <= out["top3"]


@pytest.mark.slow
def test_reward_integrity_v1_runs(capsys):
    assert _load("reward_integrity_v1").main(["--plan", "1:1", "--sample", "5"]) == 0
    assert "rewards without every hidden case passing (independent run): 0" in capsys.readouterr().out


@pytest.mark.parametrize("grammar, words", [(True, False), (False, True)])
def test_from_scratch_runs_a_seed_with_each_tokenizer(grammar, words):
    """A few episodes from scratch: the seed's pass rate is a share of the fresh episodes, and the policy
    gets the words' call grammar only when asked."""
    bench = _load("from_scratch")
    out = bench.run({"n_episodes": 8}, 8, 0, grammar=grammar, words=words)
    assert out["seed"] == 0 and 0.0 <= out["pass_rate"] <= 1.0
    assert bench.policy_kwargs(grammar, words).get("call_grammar") == (list(bench.SayTheWord.WORDS) if grammar
                                                                       else None)
