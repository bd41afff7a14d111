"""bugfix-gym CLI: help, one-line errors with exit status 2, eval (table and JSON), train, Ctrl-C and --resume."""

from __future__ import annotations

import argparse
import json
import re

import gymnasium as gym
import pytest
import torch
from stable_baselines3.common.env_util import make_vec_env

import agents.cli.report
import bugfix_gym  # noqa: F401
from agents import cli
from agents.cli import main
from agents.cli.flags import (NON_NEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT, SHARE, Flag, Number, OneLineParser,
                              UsageError, add_flags, set_given)
from agents.cli.parser import build_parser, train_flags
from agents.cli.report import before_after, jsonable
from agents.cli.settings import train_settings
from agents.cli.train import make_env
from agents.algorithms.ppo import TokenPPO
from agents.bugfix.evaluation import evaluate


@pytest.fixture
def small_eval(monkeypatch):
    """A short before/after table: 4 unseen generated tasks instead of 200."""
    monkeypatch.setattr(agents.cli.report, "GENERATED_EVAL", dict(n=4, gen_seed=0))


@pytest.mark.parametrize("argv", [["--help"], ["train", "--help"], ["eval", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0 and "usage" in capsys.readouterr().out


@pytest.mark.parametrize("argv", [
    ["frobnicate"], ["train", "--timesteps", "many"], ["train", "--n-episodes", "0"], ["train", "--n-episodes", "-3"],
    ["train", "--learning-rate", "nan"], ["train", "--learning-rate", "-1e-3"], ["train", "--learning-rate", "inf"],
    ["train", "--learning-rate", "0"], ["train", "--seed", "-1"], ["train", "--gae-lambda", "5"],
    ["train", "--target-kl", "-1"], ["train", "--tasks", "mine"], ["train", "--resume", "/no/such/run"],
    ["train", "--resume", "/tmp", "--seed", "3"], ["eval"], ["eval", "m.zip", "--split", "test"],
    ["eval", "/no/such/model.zip"], ["eval", "m.zip", "--generated", "weird"], ["eval", "m.zip", "--n", "0"],
    ["eval", "m.zip", "--split", "train", "--pack", "p.json"], ["train", "--tasks", "generated", "--average-last", "0"],
    ["train", "--tasks", "generated", "--average-last", "1.5"], ["train", "--average-last", "0.5"],
    ["train", "--save-evaluated"], ["train", "--tool-coef", "0.5"],
    ["train", "--tasks", "generated", "--tool-coef", "-1"], ["train", "--no-change-cost", "nan"],
])
def test_bad_arguments_are_one_line_exit_2(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error" in err and "Traceback" not in err


def test_the_console_script_and_the_package_give_the_same_main():
    import importlib
    import tomllib

    scripts = tomllib.loads(open("pyproject.toml").read())["project"]["scripts"]
    module, _, name = scripts["bugfix-gym"].partition(":")
    assert getattr(importlib.import_module(module), name) is main is cli.main


def test_number_reads_finite_numbers_within_bounds():
    assert SHARE("1") == 1.0 and SHARE("0.25") == 0.25 and POSITIVE_INT("3") == 3 and NON_NEGATIVE_INT("0") == 0
    for number, text, says in ((SHARE, "0", "must be > 0.0, got 0"), (SHARE, "1.5", "must be <= 1.0, got 1.5"),
                               (POSITIVE_INT, "0", "must be >= 1, got 0"), (POSITIVE_INT, "2.5", "a positive integer"),
                               (POSITIVE_FLOAT, "inf", "expected a finite number"),
                               (Number(float), "x", "expected float, got 'x'")):
        with pytest.raises(argparse.ArgumentTypeError, match=re.escape(says)):
            number(text)


def test_a_flag_table_builds_the_parser_and_sets_only_the_flags_given():
    flags = (Flag("n_envs", type=POSITIVE_INT, part="run", group="budget", help="envs"),
             Flag("steps", type=POSITIVE_INT, part="run", group="budget", help="steps"),
             Flag("mask", choices=("none", "legal"), part="ppo", off_word="none", help="mask"),
             Flag("verbose", switch=True, help="talk"))
    parser = OneLineParser(prog="toy")
    add_flags(parser, flags)
    assert [f.option for f in flags] == ["--n-envs", "--steps", "--mask", "--verbose"]
    with pytest.raises(UsageError, match="not allowed with argument --n-envs"):  # one group: one of them
        parser.parse_args(["--n-envs", "2", "--steps", "3"])
    args = parser.parse_args(["--steps", "3", "--mask", "none"])
    assert args.verbose is False and parser.parse_args(["--verbose"]).verbose is True
    run, ppo = {"n_envs": 8, "steps": 1}, {"mask": "legal"}
    set_given(run, args, flags, "run")
    set_given(ppo, args, flags, "ppo")
    assert run == {"n_envs": 8, "steps": 3} and ppo == {"mask": None}  # left out: kept; 'none': off


@pytest.mark.parametrize("flag", [f for f in train_flags() if f.part is not None], ids=lambda f: f.option)
def test_every_train_flag_with_a_part_sets_that_setting_of_the_recipe(flag):
    text = flag.choices[-1] if flag.choices else "1"
    settings = train_settings(build_parser().parse_args(["train", "--tasks", "generated", flag.option, text]))
    part = settings if flag.part == "run" else settings[flag.part]
    assert part[flag.name] == flag.setting(flag.type(text) if flag.type else text)


def test_the_training_table_puts_each_base_column_before_its_ppo_column():
    before, after = {"train": {"pass_rate": 0.1}, "unseen": {"pass_rate": 0.2}}, {"train": {}, "unseen": {}}
    assert list(before_after(before, after)) == ["base train", "PPO train", "base unseen", "PPO unseen"]
    assert list(before_after(None, after)) == ["PPO train", "PPO unseen"]  # resumed: no base agent evaluated


def test_out_that_is_a_file_or_unwritable_is_one_line(tmp_path, capsys):
    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["train", "--out", str(a_file)]) == 2
    assert "is a file" in capsys.readouterr().err
    assert main(["train", "--out", "/proc/no-runs-here"]) == 2  # not creatable, even as root
    err = capsys.readouterr().err
    assert "cannot write" in err and err.count("\n") == 1


def test_corrupt_model_file(tmp_path, capsys):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"\x00" * 100)
    assert main(["eval", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not a bugfix-gym model file" in err


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory, shared_base_agent):
    path = tmp_path_factory.mktemp("model") / "m.zip"
    model = TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0)
    model.save(path)
    return path


def test_eval_table_and_json(saved_model, capsys):
    assert main(["eval", str(saved_model), "--split", "heldout", "--episodes", "1"]) == 0
    out = capsys.readouterr().out
    assert "pass rate" in out and "m.zip on heldout split" in out
    assert main(["eval", str(saved_model), "--generated", "test", "--n", "5", "--gen-seed", "3", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)  # exactly one JSON object on stdout
    assert stats["n_episodes"] == 5 and {"pass_rate", "valid_calls", "read_rate", "test_rate"} <= set(stats)
    assert main(["eval", str(saved_model), "--pack", "examples/task_pack_example.json", "--episodes", "2",
                 "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    direct = evaluate(TokenPPO.load(saved_model), bugfix_gym.load_task_pack("examples/task_pack_example.json"), 2,
                      seed=0)  # what eval must have run: the pack, 2 episodes, --seed 0
    assert stats["n_episodes"] == 6 and stats["episodes_per_task"] == 2
    assert {k: stats[k] for k in direct} == json.loads(json.dumps(jsonable(direct)))


@pytest.mark.heavy
def test_eval_call_mask_overrides_the_models_own_and_needs_a_grammar(tmp_path, shared_base_agent, capsys):
    path = tmp_path / "g.zip"
    TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
             policy_kwargs=dict(call_grammar=bugfix_gym.CALLS, call_mask_key="useful_calls")).save(path)
    runs = {}
    for flag in ([], ["--call-mask", "none"]):
        assert main(["eval", str(path), "--split", "train", "--episodes", "2", "--json", *flag]) == 0
        runs[tuple(flag)] = json.loads(capsys.readouterr().out)
    assert runs[()]["call_mask"] == "useful_calls" and runs[("--call-mask", "none")]["call_mask"] is None
    direct = TokenPPO.load(path)
    direct.policy.call_mask_key = None
    unmasked = evaluate(direct, bugfix_gym.make_tasks("train"), 2)
    assert runs[("--call-mask", "none")]["pass_rate"] == unmasked["pass_rate"]
    assert main(["eval", str(tmp_path / "g.zip"), "--call-mask", "useful_calls"]) == 0
    capsys.readouterr()


def test_train_call_mask_flag_sets_the_recipes_mask():
    def settings(*flags):
        return train_settings(build_parser().parse_args(["train", "--tasks", "generated", *flags]))

    assert settings()["call_mask"] == "useful_calls"  # the recipe's default
    assert settings("--call-mask", "none")["call_mask"] is None
    assert settings("--call-mask", "call_mask")["call_mask"] == "call_mask"
    assert train_settings(build_parser().parse_args(["train"]))["call_mask"] is None  # the book recipe: no mask


def test_eval_call_mask_on_a_free_text_model_is_one_line(saved_model, capsys):
    assert main(["eval", str(saved_model), "--call-mask", "useful_calls"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a model with a call grammar" in err


def test_train_lr_schedule_flag_sets_the_recipes_schedule():
    def settings(*flags):
        return train_settings(build_parser().parse_args(["train", "--tasks", "generated", *flags]))

    assert settings("--lr-schedule", "linear")["lr_schedule"] == "linear"
    assert settings("--lr-schedule", "constant")["lr_schedule"] == "constant"
    assert settings("--average-last", "0.5")["validation"]["average_last"] == 0.5
    assert settings()["validation"].get("average_last") is None and not settings()["save_evaluated"]
    assert main(["train", "--iterations", "2", "--lr-schedule", "linear", "--out", "unused"]) == 2  # needs env steps


def test_train_tool_coef_and_no_change_cost_flags_set_the_recipe():
    def settings(*flags):
        return train_settings(build_parser().parse_args(["train", "--tasks", "generated", *flags]))

    on = settings("--tool-coef", "0.5")
    for part in (on["base_agent"], on["ppo"]):
        assert part["tool_coef"] == 0.5 and part["tool_calls"] == ["edit"]
    off = settings("--tool-coef", "0")
    assert off["ppo"]["tool_coef"] == 0 and off["ppo"]["tool_calls"] is None
    assert settings("--no-change-cost", "0.1")["env"]["no_change_cost"] == 0.1


def test_train_practice_and_foresight_flags_set_the_recipe_and_need_the_tool_loss(capsys):
    def settings(*flags):
        return train_settings(build_parser().parse_args(["train", "--tasks", "generated", *flags]))

    on = settings("--tool-coef", "1.0", "--practice", "100", "--foresight", "0.5")
    assert on["base_agent"]["practice"] == 100 and on["ppo"]["practice"] == 100 and on["foresight"] == 0.5
    off = settings("--tool-coef", "0")  # the loss off takes what needs it along
    assert off["ppo"]["practice"] == off["base_agent"]["practice"] == 0 and off["foresight"] is None
    assert settings("--foresight", "none")["foresight"] is None and settings("--practice", "0")["ppo"]["practice"] == 0
    for flags in (["--tool-coef", "0", "--practice", "5"], ["--tool-coef", "0", "--foresight", "0.5"]):
        assert main(["train", "--tasks", "generated", *flags, "--out", "unused"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "--tool-coef above 0" in err
    for flags in (["--practice", "5"], ["--foresight", "0.5"]):  # the book recipe has no learnt base agent
        assert main(["train", *flags, "--out", "unused"]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    for bad in (["--foresight", "0"], ["--foresight", "1.5"], ["--practice", "-1"]):
        assert main(["train", "--tasks", "generated", *bad, "--out", "unused"]) == 2
        assert capsys.readouterr().err.count("\n") == 1


def test_eval_foresight_overrides_the_models_own_and_needs_a_grammar(tmp_path, shared_base_agent, saved_model,
                                                                     capsys):
    path = tmp_path / "g.zip"
    TokenPPO("TinyAgentPolicy", gym.make("BugFix-v0"), base_agent=shared_base_agent, n_episodes=4, seed=0,
             policy_kwargs=dict(call_grammar=bugfix_gym.CALLS, foresight=0.9)).save(path)
    assert TokenPPO.load(path).policy.foresight.threshold == 0.9  # saved with the model
    runs = {}
    for flag in ([], ["--foresight", "none"], ["--foresight", "1.0"]):
        assert main(["eval", str(path), "--split", "train", "--episodes", "2", "--json", *flag]) == 0
        runs[tuple(flag)] = json.loads(capsys.readouterr().out)
    assert runs[()]["foresight"] == 0.9 and runs[("--foresight", "none")]["foresight"] is None
    # nothing is above probability 1: the same episodes as without foresight
    assert runs[("--foresight", "1.0")]["pass_rate"] == runs[("--foresight", "none")]["pass_rate"]
    assert main(["eval", str(saved_model), "--foresight", "0.5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a model with a call grammar" in err


def _wrapper_option(env, name, default=None):
    """The option ``name`` of the text wrapper around ``env`` that has it (views.text_wrappers), else ``default``
    (``gym.make`` applies a wrapper only where its option is not the default)."""
    try:
        return env.get_wrapper_attr(name)
    except AttributeError:
        return default


def _train_args(out, timesteps=96, *extra):
    return ["train", "--timesteps", str(timesteps), "--n-envs", "4", "--n-episodes", "8", "--n-minibatches", "2",
            "--eval-episodes", "1", "--out", str(out), "--no-progress", "--seed", "5", *extra]


@pytest.mark.heavy
@pytest.mark.parametrize("schedule", ["constant", "linear"])
def test_ctrl_c_saves_the_last_iteration_and_resume_gives_the_uninterrupted_result(
        tmp_path, small_eval, monkeypatch, capsys, schedule):
    assert main(_train_args(tmp_path / "whole", 96, "--lr-schedule", schedule)) == 0
    whole = TokenPPO.load(tmp_path / "whole" / "tokenppo.zip")

    original = TokenPPO.train
    calls = {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 3:  # Ctrl-C during the third update
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(TokenPPO, "train", interrupted)
    assert main(_train_args(tmp_path / "cut", 96, "--lr-schedule", schedule)) == 130
    err = capsys.readouterr().err
    assert "saved iteration 2" in err and "--resume" in err
    saved = TokenPPO.load(tmp_path / "cut" / "tokenppo.zip")
    assert saved._iteration == 2 and (tmp_path / "cut" / "resume.json").exists()
    monkeypatch.setattr(TokenPPO, "train", original)
    assert main(["train", "--resume", str(tmp_path / "cut"), "--no-progress"]) == 0
    resumed = TokenPPO.load(tmp_path / "cut" / "tokenppo.zip")
    assert resumed.num_timesteps == whole.num_timesteps and resumed._iteration == whole._iteration
    for (k, v), (_, w) in zip(whole.policy.state_dict().items(), resumed.policy.state_dict().items()):
        assert torch.equal(v, w), k
    assert not (tmp_path / "cut" / "resume.json").exists()
    lr = resumed.policy.optimizer.param_groups[0]["lr"]  # the rate of the last update (SB3: at progress <= 0)
    assert lr == (1e-3 if schedule == "constant" else 0.0)
    assert main(_train_args(tmp_path / "cut")) == 2  # a finished run is not overwritten
    assert "already holds a run" in capsys.readouterr().err


def test_divergence_is_one_line_and_keeps_the_last_good_iteration(tmp_path, small_eval, monkeypatch, capsys):
    original = TokenPPO._minibatch_loss
    calls = {"n": 0}

    def poisoned(self, sample, lo, hi):
        loss, stats = original(self, sample, lo, hi)
        calls["n"] += 1
        return (loss * float("nan"), stats) if calls["n"] > 8 else (loss, stats)

    monkeypatch.setattr(TokenPPO, "_minibatch_loss", poisoned)
    assert main(_train_args(tmp_path / "nan")) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "diverged" in err and "Traceback" not in err
    kept = TokenPPO.load(tmp_path / "nan" / "tokenppo.zip")
    assert kept._iteration >= 1


def test_two_runs_in_the_same_second_get_different_folders(tmp_path):
    from agents.files.runs import new_run_dir

    a, b = new_run_dir(tmp_path), new_run_dir(tmp_path)
    assert a != b and a.is_dir() and b.is_dir()


def test_memory_is_checked_before_training(capsys, monkeypatch, tmp_path):
    """The reported run (--n-episodes 100000) on a machine with 8 GiB available: refused in one line."""
    import agents.files.runs

    import agents.bugfix.recipes

    monkeypatch.setattr(agents.files.runs, "available_memory_bytes", lambda: 8 * 2**30)

    def no_base_agent(*args, **kwargs):
        raise AssertionError("the base agent was built before the memory check")

    monkeypatch.setattr(agents.bugfix.recipes, "base_agent", no_base_agent)
    out = tmp_path / "run"
    assert main(["train", "--n-episodes", "100000", "--n-envs", "4", "--no-progress", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "GiB of memory but 8.0 GiB is available" in err and "--n-episodes" in err and err.count("\n") == 1
    assert not (out / "run.json").exists()  # refused before the run was written


def test_evaluate_matches_a_direct_evaluation(shared_base_agent):
    model = TokenPPO("TinyAgentPolicy", make_vec_env("BugFix-v0", n_envs=2), base_agent=shared_base_agent,
                     n_episodes=4, seed=0)
    tasks = bugfix_gym.make_tasks("heldout")
    a, b = evaluate(model, tasks, 2, seed=9), evaluate(model, tasks, 2, seed=9)
    assert a == b and a["n_episodes"] == 20


def _small_generated(recipe: dict, validation: dict, n_tasks: int) -> dict:
    """The generalisation recipe with its base agent, practice and validation cut to a test's size."""
    return dict(recipe, validation=validation,
                base_agent=dict(recipe["base_agent"], n_tasks=n_tasks, steps=2, practice=20, practice_steps=2),
                ppo=dict(recipe["ppo"], practice=20))


@pytest.mark.heavy
@pytest.mark.parametrize("average_last", [None, 0.5])
def test_generated_recipe_trains_from_its_own_base_agent_and_keeps_the_best_weights(
        tmp_path, small_eval, monkeypatch, capsys, average_last):
    from agents.bugfix.recipes import RECIPES

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    validation = dict(generated="heldout", n=3, gen_seed=77, every=1, average_last=average_last)
    recipe = _small_generated(RECIPES["generated"], validation=validation, n_tasks=10)
    monkeypatch.setitem(RECIPES, "generated", recipe)
    out = tmp_path / "gen"
    assert main(["train", "--tasks", "generated", "--iterations", "2", "--n-envs", "4", "--n-episodes", "8",
                 "--n-minibatches", "2", "--eval-episodes", "1", "--out", str(out), "--no-progress",
                 "--save-evaluated"]) == 0
    printed = capsys.readouterr().out
    evaluated = sorted(p.name for p in (out / "evaluated").iterdir())
    assert evaluated == ["iteration-0000.zip", "iteration-0001.zip", "iteration-0002.zip"]
    assert TokenPPO.load(out / "evaluated" / "iteration-0002.zip")._iteration == 2
    results = json.loads((out / "results.json").read_text())
    assert [it for it, _ in results["validation"]["history"]] == [0, 1, 2]
    if average_last is None:
        assert "kept the weights of iteration" in printed
    else:  # the mean of the weights of the latest half of the three evaluations: iterations 1 and 2
        assert "kept the mean of the weights of iterations 1-2 (2 of 3 evaluations" in printed
        assert results["validation"]["averaged_iterations"] == [1, 2]
    model = TokenPPO.load(out / "tokenppo.zip")
    assert model.policy.tokenizer.words == bugfix_gym.fixed_tokenizer().words  # reads any generated code
    assert model.policy.grammar is not None and model.config.kl_coef == RECIPES["generated"]["ppo"]["kl_coef"]
    train_env = make_env(json.loads((out / "run.json").read_text()), 1, 0).envs[0]
    assert train_env.unwrapped.ambiguous_share == 0.3 and _wrapper_option(train_env, "statement_dropout", 0.0) == 0.0
    assert list((tmp_path / "cache").glob("base_agent-*.pt"))  # the recipe's base agent, cached


@pytest.mark.heavy
@pytest.mark.parametrize("ablation", ["book-tasks", "blind-tools"])
def test_ablations_change_the_demonstrations_the_training_envs_and_validation(
        ablation, tmp_path, small_eval, monkeypatch, capsys):
    import agents.bugfix.base_agent
    from agents.bugfix.recipes import RECIPES

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    recipe = _small_generated(RECIPES["generated"], validation=dict(generated="heldout", n=3, gen_seed=77, every=1),
                              n_tasks=40)
    monkeypatch.setitem(RECIPES, "generated", recipe)
    demo_envs = []
    make_bugfix_env = agents.bugfix.base_agent.make_bugfix_env

    def spy_make_env(**kwargs):  # the env the base agent's demonstrations are played in
        demo_envs.append(make_bugfix_env(**kwargs))
        return demo_envs[-1]

    monkeypatch.setattr(agents.bugfix.base_agent, "make_bugfix_env", spy_make_env)
    evaluated_with = []
    original = agents.bugfix.evaluation.evaluate

    def spy_evaluate(model, tasks, episodes_per_task=1, seed=0, env_kwargs=None):
        evaluated_with.append(env_kwargs)
        return original(model, tasks, episodes_per_task, seed, env_kwargs=env_kwargs)

    monkeypatch.setattr(agents.bugfix.evaluation, "evaluate", spy_evaluate)
    out = tmp_path / ablation
    assert main(["train", "--tasks", "generated", "--ablation", ablation, "--iterations", "1", "--n-envs", "4",
                 "--n-episodes", "8", "--n-minibatches", "2", "--eval-episodes", "1", "--out", str(out),
                 "--no-progress"]) == 0
    settings = json.loads((out / "run.json").read_text())
    assert settings["ablation"] == ablation
    (demo_env,) = demo_envs
    model = TokenPPO.load(out / "tokenppo.zip", env=make_env(settings, 1, 0))
    train_wrapped = model.get_env().envs[0]
    train_env = train_wrapped.unwrapped
    if ablation == "book-tasks":
        book = {t.name for t in bugfix_gym.make_tasks("train")}
        assert {t.name for t in demo_env.unwrapped.tasks} == book and train_env.generated is None
        assert {t.name for t in train_env.tasks} == book
        assert all(kw is None for kw in evaluated_with)
    else:
        assert _wrapper_option(demo_env, "hide_outputs") == _wrapper_option(train_wrapped, "hide_outputs") == (
            "read", "test")
        assert train_env.generated == "train"
        assert evaluated_with and all(kw == {"hide_outputs": ["read", "test"]} for kw in evaluated_with)
    assert main(["train", "--ablation", ablation, "--out", str(tmp_path / "x")]) == 2  # needs --tasks generated
    assert "--tasks generated" in capsys.readouterr().err


def test_generalisation_report_prints_the_behaviour_report_and_replays_transcripts(saved_model, capsys, monkeypatch):
    import importlib.util

    spec = importlib.util.spec_from_file_location("generalisation_report", "examples/generalisation_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    assert report.main([str(saved_model), "--n", "6", "--transcripts", "6"]) == 0
    out = capsys.readouterr().out
    for label in ("pass rate", "read rate", "test rate", "revert use", "first edit right", "pass | read"):
        assert label in out
    assert report.looked_first([" read ", " edit fix_init "]) and not report.looked_first([" edit fix_init ", " read "])
    assert report.interest([" read ", " edit fix_init ", " test ", " revert ", " edit swap_minmax "]) == (True, True, 2)
    assert report.interest([" read ", " submit "]) == (False, False, 0)
    task = bugfix_gym.generate_tasks("test", 1, seed=0)[0]
    text = report.transcript(task, [" read ", f" edit {task.fix_op} ", " submit "], {})
    assert text.count(">>>") == 3 and "hidden tests passed" in text  # the replay is the episode as played
    assert report.main(["/no/such/model.zip"]) == 2
    tasks = bugfix_gym.generate_tasks("test", 3, seed=0)
    fake = [type("T", (), {"info": {"submitted": ok, "hidden_pass": True}}) for ok in (True, False, True)]
    groups = report.per_template(tasks, fake)
    assert sum(map(len, groups.values())) == 3 and set(groups) == {t.template for t in tasks}
    assert sorted(sum(groups.values(), [])) == [False, True, True]


def test_generalisation_report_statement_probe_replaces_only_the_statement(saved_model, capsys, monkeypatch):
    import importlib.util

    import agents.bugfix.evaluation

    spec = importlib.util.spec_from_file_location("generalisation_report", "examples/generalisation_report.py")
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    seen = []
    original = agents.bugfix.evaluation.sample_episodes

    def spy(model, tasks, *args, **kwargs):
        seen.extend(tasks)
        return original(model, tasks, *args, **kwargs)

    monkeypatch.setattr(report, "sample_episodes", spy)
    probe = ["--n", "4", "--transcripts", "0", "--statement", "return the right value"]
    assert report.main([str(saved_model), *probe]) == 0
    plain = bugfix_gym.generate_tasks("test", 4, seed=123)
    assert [t.statement for t in seen] == ["return the right value"] * 4
    assert [(t.name, t.source, t.hidden) for t in seen] == [(t.name, t.source, t.hidden) for t in plain]
    assert "pass rate per template" in capsys.readouterr().out


def test_edit_answer_probe_scores_the_models_predictions_against_what_the_ops_do(saved_model, capsys):
    import importlib.util

    from bugfix_gym import FIX_OPS, apply_op, generate_tasks

    spec = importlib.util.spec_from_file_location("edit_answer_probe", "examples/edit_answer_probe.py")
    probe = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(probe)
    model = TokenPPO.load(saved_model)
    # nothing has probability above 1: every op is predicted to change the code, so the accuracy is the
    # share of (task, op) pairs where the op does change it
    r = probe.probe(model, "test", 4, 123, threshold=1.0)
    sources = [t.source for t in generate_tasks("test", 4, seed=123)]
    changed = [apply_op(s, op) != s for s in sources for op in FIX_OPS]
    assert r["pairs"] == 20 and r["accuracy"] == sum(changed) / 20
    assert probe.main([str(saved_model), "--n", "2"]) == 0
    out = capsys.readouterr().out
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["train", "heldout", "test"]
    assert probe.main([str(saved_model) + ".missing"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_ppo_flags_come_from_the_settings_definitions():
    """Each flag of a TokenPPO setting takes its help and choices from PPOConfig, and its type reads
    as valid exactly the values the setting's own check allows (``--target-kl 0`` is the CLI's off)."""
    import dataclasses

    from agents.algorithms.config import PPOConfig

    fields = {f.name: f for f in dataclasses.fields(PPOConfig)}
    flags = [f for f in train_flags() if f.part == "ppo"]
    assert [f.name for f in flags] == ["n_episodes", "n_epochs", "n_minibatches", "learning_rate", "gae_lambda",
                                       "ent_coef", "target_kl", "target_kl_mode", "group_size"]
    for flag in flags:
        meta = fields[flag.name].metadata
        assert flag.help == meta["help"] or flag.name == "target_kl", flag.name
        if meta["choices"] is not None:
            assert flag.choices == tuple(meta["choices"]) and flag.type is None
            continue
        for text in ("-1", "0", "0.5", "1", "2", "1.5", "3"):
            try:
                value = flag.type(text)
            except argparse.ArgumentTypeError:
                value = None
            if flag.name == "target_kl" and value == 0:
                continue  # the command line's 0 is the setting's None (off)
            try:
                meta["check"](flag.name, float(text) if "." in text or flag.type.kind is float else int(text))
                allowed = True
            except ValueError:
                allowed = False
            assert (value is not None) == allowed, (flag.name, text)


def _reads(parse, text):
    """What a flag type reads ``text`` as, or None when it refuses it."""
    try:
        return parse(text)
    except argparse.ArgumentTypeError:
        return None


@pytest.mark.parametrize("name", ["epsilon", "epsilon_high", "beta", "num_iterations", "scale_rewards"])
def test_each_trl_flag_reads_what_the_setting_it_becomes_allows(name):
    """TRL's options take the bounds and choices of the TokenPPO setting they become, defined there once:
    a value the flag reads is one PPOConfig takes, and a value the flag refuses PPOConfig refuses too."""
    import dataclasses

    from agents.algorithms.config import PPOConfig, choices_of
    from agents.algorithms.trl_options import TRL_SETTINGS

    flag = {f.name: f for f in train_flags()}[name]
    setting = TRL_SETTINGS[name]
    field = {f.name: f for f in dataclasses.fields(PPOConfig)}[setting]
    assert flag.part is None and flag.default is None  # the command reads it; left out: the algorithm's own
    if flag.choices is not None:
        assert flag.choices == choices_of(field) and flag.type is None
        return
    for text in ("-1", "0", "1e-9", "0.5", "1", "2", "3.5", "4096"):
        number = int(text) if flag.type.kind is int and text.lstrip("-").isdigit() else float(text)
        try:
            field.metadata["check"](setting, number)
            allowed = True
        except ValueError:
            allowed = False
        assert (_reads(flag.type, text) is not None) == allowed, (name, text)


def test_every_foresight_flag_reads_the_threshold_foresight_takes():
    """``--foresight`` (train, eval, serve) and ``--rollout-foresight`` take foresight's one bound: what
    :func:`check_threshold` allows, and ``none`` (off) for ``--foresight``."""
    from agents.decoding.foresight import check_threshold

    parser = build_parser()
    commands = {"train": [], "eval": ["m.zip"], "serve": ["m.zip"]}
    for text in ("-1", "0", "1e-12", "0.5", "1", "1.0001", "nan"):
        try:
            check_threshold(float(text))
            allowed = text != "nan"
        except ValueError:
            allowed = False
        for command, rest in commands.items():
            try:
                read = parser.parse_args([command, *rest, "--foresight", text]).foresight
            except UsageError:
                read = None
            assert (read == float(text)) == allowed, (command, text)
        assert (_reads({f.name: f for f in train_flags()}["rollout_foresight"].type, text) is not None) == allowed
    assert all(parser.parse_args([c, *rest, "--foresight", "none"]).foresight is None for c, rest in commands.items())
