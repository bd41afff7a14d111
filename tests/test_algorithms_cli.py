"""``bugfix-gym train --algo NAME``: every named algorithm trains on the book's and the generated tasks,
its model evaluates with ``bugfix-gym eval`` as its own class, results.json says the algorithm and its
curve; TRL's flags reach the settings; a flag the algorithm lacks is a one-line error."""
from __future__ import annotations

import json

import pytest
import torch

import agents.cli.report
from agents.algorithms.ppo import TokenPPO
from agents.algorithms.presets import ALGORITHM_NAMES, get_preset, load_algorithm
from agents.algorithms.reinforce import Reinforce
from agents.cli import main
from agents.cli.parser import build_parser
from agents.cli.settings import train_settings


@pytest.fixture
def small_eval(monkeypatch):
    """A short before/after table: 4 unseen generated tasks instead of 200."""
    monkeypatch.setattr(agents.cli.report, "GENERATED_EVAL", dict(n=4, gen_seed=0))


def _settings(*argv: str) -> dict:
    return train_settings(build_parser().parse_args(["train", *argv]))


def _train(out, *extra: str) -> list[str]:
    return ["train", "--n-envs", "8", "--n-episodes", "8", "--eval-episodes", "1", "--out", str(out),
            "--no-progress", "--seed", "5", *extra]


def _check_run(out, name, capsys) -> None:
    """The run's model is its preset's class with its name; results.json has the algo and one curve
    entry per iteration; ``bugfix-gym eval --json`` reads the model."""
    model = load_algorithm(out / "tokenppo.zip")
    assert type(model) is get_preset(name).cls and model.config.preset == name
    results = json.loads((out / "results.json").read_text())
    assert results["algo"] == name and len(results["curve"]) == model.iteration >= 1
    assert results["trained_by"] == json.loads(json.dumps(dict(algo=name, cls=type(model).__name__,
                                                               preset_settings=get_preset(name).settings)))
    entry = results["curve"][-1]
    assert set(entry) == {"iteration", "num_timesteps", "pass_rate", "valid_calls"}
    assert entry["iteration"] == model.iteration and 0.0 <= entry["pass_rate"] <= 1.0
    capsys.readouterr()
    assert main(["eval", str(out / "tokenppo.zip"), "--split", "train", "--episodes", "1", "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert 0.0 <= printed["pass_rate"] <= 1.0
    assert (printed["algo"], printed["cls"], printed["preset_settings"]) == (
        name, type(model).__name__, results["trained_by"]["preset_settings"])


@pytest.mark.parametrize("name", ALGORITHM_NAMES)
def test_every_algorithm_trains_on_the_book_tasks_and_evaluates(name, tmp_path, small_eval, capsys):
    out = tmp_path / name
    assert main(_train(out, "--algo", name, "--iterations", "1")) == 0
    _check_run(out, name, capsys)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["grpo", "reinforce", "gigpo"])
def test_algorithms_train_with_a_timestep_budget_on_the_generated_tasks(name, tmp_path, small_eval, monkeypatch,
                                                                        capsys):
    from test_ppo_cli import _small_generated

    from agents.bugfix.recipes import RECIPES

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    recipe = _small_generated(RECIPES["generated"], validation=dict(generated="heldout", n=2, gen_seed=77, every=1),
                              n_tasks=10)
    monkeypatch.setitem(RECIPES, "generated", recipe)
    out = tmp_path / name
    assert main(_train(out, "--tasks", "generated", "--algo", name, "--timesteps", "60")) == 0
    _check_run(out, name, capsys)
    settings = json.loads((out / "run.json").read_text())
    if name == "reinforce":  # TokenPPO's settings of the recipe are dropped, and said so
        assert {"ent_coef", "kl_coef", "tool_coef", "practice"} <= set(settings["dropped_settings"])
        assert "n_epochs" not in settings["ppo"]
    else:
        assert settings["dropped_settings"] == [] and settings["ppo"]["tool_coef"] == 1.0


def test_ppo_is_the_defaults_with_the_recipe_s_delta_exactly():
    import dataclasses

    from agents.algorithms.config import PPOConfig
    from agents.bugfix.recipes import RECIPES

    defaults = {f.name: f.default for f in dataclasses.fields(PPOConfig) if f.name != "aux_losses"}
    for tasks in ("book", "generated"):
        settings = _settings("--tasks", tasks)
        assert settings["ppo"] == dict(defaults, **RECIPES[tasks]["ppo"]) and settings["algo"] == "ppo"
        assert settings["dropped_settings"] == []
    assert RECIPES["book"]["ppo"] == {}  # the book's recipe is TokenPPO's defaults
    assert all(RECIPES["generated"]["ppo"][name] != default for name, default in defaults.items()
               if name in RECIPES["generated"]["ppo"])  # a delta restates no default


@pytest.mark.heavy
def test_settings_are_defaults_then_recipe_then_preset_then_flags():
    """One pass, each later source winning: ent_coef is the generated recipe's over the default, group_size the
    preset's over the default, clip_range the flag's over the preset's; what no source sets is the default."""
    import json
    import subprocess
    import sys

    ppo = _settings("--tasks", "generated", "--algo", "gmpo", "--group-size", "4")["ppo"]
    assert (ppo["ent_coef"], ppo["kl_coef"], ppo["clip_range"], ppo["group_size"], ppo["n_epochs"]) == \
        (0.005, 0.05, 0.4, 4, 4)
    flagged = _settings("--tasks", "generated", "--algo", "gmpo", "--ent-coef", "0.1", "--target-kl", "0")["ppo"]
    assert (flagged["ent_coef"], flagged["target_kl"], flagged["clip_range"]) == (0.1, None, 0.4)
    printed = subprocess.run([sys.executable, "-m", "agents.cli", "train", "--print-config", "--algo", "gmpo",
                              "--tasks", "generated"], capture_output=True, text=True, check=True).stdout
    assert json.loads(printed)["ppo"] == _settings("--algo", "gmpo", "--tasks", "generated")["ppo"]


def test_the_preset_wins_over_the_recipe_and_the_flags_over_both():
    settings = _settings("--algo", "dapo", "--n-episodes", "16", "--epsilon-high", "0.3", "--group-size", "4")
    ppo = settings["ppo"]
    assert (ppo["clip_range_high"], ppo["n_episodes"], ppo["group_size"]) == (0.3, 16, 4)
    assert ppo["drop_zero_variance_groups"] is True and ppo["vf_coef"] == 0.0
    assert ppo["n_epochs"] == 4  # the recipe's, which the preset leaves


def test_trl_flags_translate_together():
    ppo = _settings("--algo", "grpo", "--loss-type", "cispo", "--epsilon", "0.2", "--epsilon-high", "5",
                    "--beta", "0", "--num-iterations", "2", "--scale-rewards", "batch",
                    "--mask-truncated-completions")["ppo"]
    assert (ppo["policy_loss"], ppo["max_is_weight"], ppo["loss_mode"]) == ("cispo", 5.0, "token_mean")
    assert ppo.get("clip_range_high") is None  # cispo's epsilon_high is its cap, not the ratio clip
    assert (ppo["kl_coef"], ppo["n_epochs"], ppo["scale_rewards"], ppo["mask_truncated_completions"]) == \
        (0.0, 2, "batch", True)
    assert _settings("--algo", "grpo", "--importance-sampling-level", "sequence")["ppo"]["policy_loss"] == "gspo"
    assert _settings("--algo", "gspo", "--importance-sampling-level", "token")["ppo"]["policy_loss"] == "ppo_clip"


@pytest.mark.parametrize("argv, says", [
    (["--algo", "reinforce", "--n-epochs", "2"], "--n-epochs sets n_epochs, which --algo reinforce (Reinforce)"),
    (["--algo", "rebn", "--beta", "0.1"], "--beta sets kl_coef"),
    (["--algo", "reinforce", "--epsilon", "0.2"], "--epsilon sets clip_range"),
    (["--algo", "reinforce", "--tasks", "generated", "--tool-coef", "0.5"], "--tool-coef sets tool_coef"),
    (["--algo", "cispo", "--loss-type", "cispo", "--importance-sampling-level", "sequence"], "no sequence form"),
    (["--algo", "grpo2"], "invalid choice"),
])
def test_a_flag_the_algorithm_lacks_is_one_line_exit_2(argv, says, capsys):
    assert main(["train", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and "Traceback" not in err


def test_an_old_run_without_algo_builds_token_ppo():
    from agents.cli.train import _name

    assert _name(object.__new__(TokenPPO), {}) == "TokenPPO"
    assert _name(object.__new__(Reinforce), {"algo": "rebn"}) == "Reinforce (rebn)"


def test_the_example_trains_a_preset_and_prints_before_and_after(tmp_path, monkeypatch, capsys):
    import sys
    from pathlib import Path

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "examples"))
    monkeypatch.chdir(tmp_path)
    import algorithms as example

    result = example.main(["--quick", "--algo", "rloo"])
    printed = capsys.readouterr().out
    assert "rloo (TokenPPO): 2 iterations of 16 episodes" in printed and "before" in printed
    assert set(result) == {"before", "after"} and all(0 <= v <= 1 for r in result.values() for v in r.values())
    assert load_algorithm(tmp_path / "runs/examples/algorithms-rloo.zip").config.preset == "rloo"
    sys.modules.pop("algorithms", None)


@pytest.mark.heavy
@pytest.mark.parametrize("name", ["rebn", "grpo"])
def test_a_stopped_run_of_a_named_algorithm_resumes_as_that_algorithm(name, tmp_path, small_eval, monkeypatch,
                                                                      capsys):
    """Ctrl-C during the second update of a Reinforce / critic-free preset; ``--resume`` rebuilds its class
    (run.json of a Reinforce run has no PPO-only entries) and ends where an uninterrupted run ends."""
    cls = get_preset(name).cls
    argv = _train(tmp_path / "whole", "--algo", name, "--timesteps", "200", "--n-envs", "4")
    assert main(argv) == 0
    whole = load_algorithm(tmp_path / "whole" / "tokenppo.zip")
    original, calls = cls.train, {"n": 0}

    def interrupted(self):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return original(self)

    monkeypatch.setattr(cls, "train", interrupted)
    cut = tmp_path / "cut"
    assert main([*argv[:argv.index("--out") + 1], str(cut), *argv[argv.index("--out") + 2:]]) == 130
    monkeypatch.setattr(cls, "train", original)
    capsys.readouterr()
    assert main(["train", "--resume", str(cut), "--no-progress"]) == 0, capsys.readouterr().err
    resumed = load_algorithm(cut / "tokenppo.zip")
    assert type(resumed) is cls and resumed.config.preset == name and resumed.num_timesteps == whole.num_timesteps
    for (k, v), (_, w) in zip(whole.policy.state_dict().items(), resumed.policy.state_dict().items()):
        assert torch.equal(v, w), k


def test_preset_only_leaves_the_recipe_s_loss_additions_out_and_refuses_foresight(capsys):
    """--preset-only: the generated recipe's KL, entropy and auxiliary losses are not in the run's settings
    (the preset's own KL stays), its tasks and base agent are; with the recipe's foresight on it is a one-line
    error, since foresight reads the tool-output loss it leaves out."""
    protocol = ("--tasks", "generated", "--foresight", "none", "--call-mask", "call_mask")
    full = _settings(*protocol, "--algo", "rloo")
    bare = _settings(*protocol, "--algo", "rloo", "--preset-only")
    assert (full["ppo"]["kl_coef"], full["ppo"]["ent_coef"], full["ppo"]["tool_coef"]) == (0.05, 0.005, 1.0)
    assert (bare["ppo"]["kl_coef"], bare["ppo"]["ent_coef"], bare["ppo"]["kl_reward_coef"]) == (0.0, 0.0, 0.05)
    assert "tool_coef" not in bare["ppo"] and bare["base_agent"] == full["base_agent"] and bare["preset_only"]
    assert main(["train", "--tasks", "generated", "--preset-only", "--print-config"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--foresight none" in err
