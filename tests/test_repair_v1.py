"""The BugFix-v1 repair recipe: the base agent's demonstrations (train split only, tokenized as the sampler
records), its cache, the fixed validation and evaluation sets, the baselines on the same tasks, the train command's
flags and one tiny end-to-end run."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY
from bugfix_gym.core.env_v1 import BugFixEnvV1

from agents.bugfix import base_agent_v1 as bav1
from agents.bugfix.recipe_v1 import RepairRecipeV1, with_changes
from agents.bugfix.repair_v1 import tasks_per_function
from agents.bugfix.v1 import baseline_v1, pass_after_test_calls, summarise_v1
from agents.cli import main
from agents.cli.train_v1 import wants_v1
from agents.model.tinyagent import TinyAgentConfig

TINY = TinyAgentConfig(vocab_size=ByteTokenizer().vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=2200)


def split_problems(split: str) -> set[str]:
    return {t.problem for t in BugFixEnvV1(split=split).tasks}


def test_demonstrations_come_from_the_train_split_only_spread_over_its_functions():
    tasks = bav1.demonstration_tasks(150, seed=0)
    problems = [t.problem for t in tasks]
    train = split_problems("train")
    assert set(problems) <= train
    assert not set(problems) & (split_problems("heldout") | split_problems("test"))
    assert len(set(problems[:len(train)])) == len(train)  # a round over every function first
    assert all(len(t.bugs) == 1 for t in tasks)
    assert [t.name for t in bav1.demonstration_tasks(150, seed=0)] == [t.name for t in tasks]
    assert [t.name for t in bav1.demonstration_tasks(150, seed=1)] != [t.name for t in tasks]


def test_a_demonstration_is_the_debuggers_calls_tokenized_as_the_sampler_records_them():
    tok = ByteTokenizer()
    env = BugFixEnvV1(split="train", bugs=1, max_turns=12)
    task = bav1.demonstration_tasks(1, seed=0)[0]
    traj = bav1.debugger_episode(env, task, tok, max_len=4096, max_call_tokens=40)
    assert traj is not None
    calls = traj.info["actions"]
    ids, owner = traj.ids.tolist(), traj.owner.tolist()
    written, current = [], []
    for i, o in zip(ids, owner):  # the policy's segments, each ended by <eoc>
        if o == OWNER_POLICY:
            current.append(i)
            if i == tok.eoc_id:
                written.append(tok.decode(current))
                current = []
    assert written == list(calls)
    assert written[:3] == ["read", "test", "locate"]
    assert traj.policy_mask.sum() == sum(len(c.encode()) + 1 for c in calls)
    # an episode that does not fit is left out rather than cut
    assert bav1.debugger_episode(env, task, tok, max_len=200, max_call_tokens=40) is None


@pytest.mark.heavy  # ~18 s: it plays and clones four debugger episodes
def test_the_base_agent_clones_the_debugger_and_is_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path))
    tok = ByteTokenizer()
    cfg = bav1.BaseAgentV1Config(demonstrations=4, steps=25, batch_size=4, lr=3e-3)
    data = bav1.cached_demonstrations(tok, cfg, TINY.max_len, 40)
    untrained = _cloning_nll(bav1.TinyAgent(TINY), data)
    agent = bav1.cached_base_agent_v1(tok, TINY, 0, cfg, 40)
    assert _cloning_nll(agent, data) < 0.8 * untrained  # it learned the debugger's calls
    again = bav1.cached_base_agent_v1(tok, TINY, 0, cfg, 40)  # from the cache
    assert all(torch.equal(a, b) for a, b in zip(agent.state_dict().values(), again.state_dict().values()))
    path = bav1.cached_path(tok, TINY, 0, cfg, 40)
    path.write_bytes(b"not a checkpoint")
    with pytest.warns(UserWarning, match="unreadable base-agent cache"):
        retrained = bav1.cached_base_agent_v1(tok, TINY, 0, cfg, 40)
    assert all(torch.equal(a, b) for a, b in zip(agent.state_dict().values(), retrained.state_dict().values()))


class _Replay(torch.nn.Module):
    """A "model" whose logits put all mass on the episode's own next token, except at ``wrong`` positions."""

    def __init__(self, ids: torch.Tensor, vocab: int, wrong: set[int] = frozenset()):
        super().__init__()
        self.ids, self.vocab, self.wrong = ids, vocab, wrong

    def forward(self, ids):
        logits = torch.zeros(1, len(self.ids), self.vocab)
        for t in range(len(self.ids) - 1):
            target = int(self.ids[t + 1])
            logits[0, t, (target + 1) % self.vocab if t in self.wrong else target] = 30.0
        return logits, torch.zeros(1, len(self.ids))


def test_imitation_scores_read_each_call_and_its_site_off_the_argmax():
    tok = ByteTokenizer()
    env = BugFixEnvV1(split="train", bugs=1, max_turns=12)
    traj = bav1.debugger_episode(env, bav1.demonstration_tasks(1, seed=0)[0], tok, max_len=4096, max_call_tokens=40)
    calls = traj.info["actions"]
    edits = [c for c in calls if c.startswith(("edit ", "delete "))]
    assert edits, "the debugger edits in this episode"
    perfect = bav1.imitation_scores(_Replay(traj.ids, tok.vocab_size), [traj], tok)
    assert perfect["nll"] < 1e-6 and perfect["call_accuracy"] == perfect["site_accuracy"] == 1.0
    assert perfect["first_edit_accuracy"] == 1.0 and (perfect["calls"], perfect["edits"]) == (len(calls), len(edits))
    # wrong on the last token of every call's site ("edit L.K" / "delete L"): every edit's site is missed, and so
    # is each edit call, while the other calls stay right
    owner, wrong, t = traj.owner.tolist(), set(), 0
    while t < len(owner):
        if owner[t] == 2:
            end = t
            while owner[end] == 2:
                end += 1
            text = tok.decode(traj.ids[t:end].tolist())
            if text.startswith(("edit ", "delete ")):
                wrong.add(t - 1 + len(" ".join(text.split()[:2])) - 1)  # the position predicting the site's last byte
            t = end
        t += 1
    missed = bav1.imitation_scores(_Replay(traj.ids, tok.vocab_size, wrong), [traj], tok)
    assert missed["site_accuracy"] == missed["first_edit_accuracy"] == 0.0
    assert missed["call_accuracy"] == pytest.approx((len(calls) - len(edits)) / len(calls))
    assert missed["nll"] == pytest.approx(30.0 * len(wrong) / float(traj.policy_mask.sum()), rel=1e-3)


def _cloning_nll(model, data) -> float:
    from agents.algorithms.losses import masked_mean
    from agents.model.tinyagent import sequence_log_probs

    with torch.no_grad():
        return float(-masked_mean(sequence_log_probs(model, data["ids"]), data["policy_mask"]))


def test_validation_and_evaluation_sets_are_fixed_and_of_their_split():
    held = tasks_per_function("heldout", 2)
    assert {t.problem for t in held} == split_problems("heldout")
    assert len(held) == 2 * len(split_problems("heldout"))
    assert [t.name for t in held] == [t.name for t in tasks_per_function("heldout", 2)]
    test = tasks_per_function("test", 1, bugs=2)
    assert {t.problem for t in test} <= split_problems("test") and all(len(t.bugs) == 2 for t in test)


def test_pass_after_test_calls_counts_passes_within_the_budget():
    assert pass_after_test_calls([True, True, False, True], [0, 2, 1, 5], ks=(0, 1, 2, 5)) == {
        0: 0.25, 1: 0.25, 2: 0.5, 5: 0.75}


def test_the_baselines_play_the_same_tasks_and_report_what_the_model_reports():
    tasks = tasks_per_function("test", 1)[:3]
    stats = baseline_v1("debugger", tasks)
    assert stats["episodes"] == 3 and 0.0 <= stats["pass_rate"] <= 1.0
    assert stats["mean_test_calls"] >= 2  # test and locate before any edit
    assert set(stats["pass_after_test_calls"]) == {0, 1, 2, 3, 4, 5}
    assert stats["pass_after_test_calls"][0] == 0.0  # the debugger never submits before testing
    infos = [dict(actions=["test", "edit 1.1 op +", "submit"], hidden_pass=True, n_invalid=0),
             dict(actions=["submit"], hidden_pass=False, n_invalid=1)]
    two = summarise_v1(tasks[:2], 1, infos)
    assert (two["pass_rate"], two["mean_calls"], two["mean_test_calls"], two["valid_calls"]) == (0.5, 2.0, 0.5, 0.75)


def test_the_recipe_is_one_dataclass_and_its_flags_are_its_fields(capsys):
    assert wants_v1(["--env", "BugFix-v1"]) and wants_v1(["--env=BugFix-v1"]) and not wants_v1(["--seed", "1"])
    assert main(["train", "--env", "BugFix-v1", "--print-config", "--base-steps", "7", "--minutes", "3.5",
                 "--algo", "grpo", "--base-cosine", "--base-weight-decay", "0.1"]) == 0
    printed = json.loads(capsys.readouterr().out)
    recipe = RepairRecipeV1.from_dict(printed["recipe"])
    assert recipe == with_changes(RepairRecipeV1(), base_steps=7, minutes=3.5, base_cosine=True,
                                  base_weight_decay=0.1)
    assert main(["train", "--env", "BugFix-v1", "--print-config", "--no-base-cosine"]) == 0  # a switch turns off too
    assert RepairRecipeV1.from_dict(json.loads(capsys.readouterr().out)["recipe"]) == RepairRecipeV1()
    assert (printed["algo"], printed["foresight"], printed["decoding"]) == ("grpo", None, "legal-call grammar")
    assert set(printed["recipe"]) == {f.name for f in dataclasses.fields(RepairRecipeV1)}


def test_the_recipes_kl_to_the_base_agent_replaces_the_presets_and_needs_a_reference():
    from agents.algorithms.presets import get_preset

    plain = RepairRecipeV1()
    assert "kl_coef" not in plain.algorithm_settings("ppo")  # off unless asked for: the preset's own stays
    assert plain.trained_settings("grpo")["kl_coef"] == get_preset("grpo").settings["kl_coef"]
    anchored = with_changes(plain, kl_coef=0.2)
    assert anchored.trained_settings("ppo")["kl_coef"] == 0.2 == anchored.trained_settings("grpo")["kl_coef"]
    with pytest.raises(ValueError, match="reference policy"):
        anchored.algorithm_settings("reinforce")
    with pytest.raises(ValueError, match="kl_coef"):
        RepairRecipeV1(kl_coef=-0.1)


def test_the_demonstrations_cache_does_not_depend_on_how_they_are_cloned(tmp_path, monkeypatch):
    """Cloning longer (or at another learning rate) reuses the played demonstrations."""
    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path))
    tok = ByteTokenizer()
    cfg = bav1.BaseAgentV1Config(demonstrations=1, steps=3)
    first = bav1.cached_demonstrations(tok, cfg, TINY.max_len, 40)
    again = bav1.cached_demonstrations(tok, dataclasses.replace(cfg, steps=9, lr=1e-4), TINY.max_len, 40)
    assert torch.equal(first["ids"], again["ids"])
    assert len(list(tmp_path.glob("demonstrations_v1-*.pt"))) == 1  # one cache file: read, not played again
    bav1.cached_demonstrations(tok, dataclasses.replace(cfg, demonstrations=2), TINY.max_len, 40)
    assert len(list(tmp_path.glob("demonstrations_v1-*.pt"))) == 2  # more demonstrations: played


@pytest.mark.parametrize("argv, says", [
    (["--minutes", "0"], "--minutes"), (["--tokenizer", "words"], "--tokenizer"), (["--bugs", "3"], "bugs"),
    (["--foresight", "0.5"], "unrecognized"), (["--algo", "nope"], "--algo"),
    (["--kl-coef", "0.1", "--algo", "reinforce"], "reference policy"), (["--base-weight-decay", "-1"], ">= 0"),
    (["--base-cosine", "yes"], "unrecognized")])
def test_a_bad_v1_train_flag_is_one_line(argv, says, capsys):
    assert main(["train", "--env", "BugFix-v1", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and "\n" not in err


@pytest.mark.heavy
def test_one_tiny_run_leaves_a_model_and_results_and_eval_reads_them(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "run"
    status = main(["train", "--env", "BugFix-v1", "--rl-only", "--seed", "1", "--out", str(out), "--tokenizer",
                   "bpe", "--d-model", "16", "--n-layer", "1", "--d-ff", "32", "--base-demonstrations", "4",
                   "--base-steps", "2", "--iterations", "1", "--n-episodes", "4", "--n-envs", "4",
                   "--validation-tasks", "1", "--eval-tasks", "1", "--no-progress"])
    assert status == 0
    assert sorted(p.name for p in out.iterdir() if p.suffix == ".zip") == ["tokenppo.zip"]
    results = json.loads((out / "results.json").read_text())
    assert results["algo"] == "ppo" and results["seed"] == 1 and results["iterations"] >= 1
    assert results["validation"] and results["trained"]["episodes"] == len(split_problems("test"))
    assert results["settings"]["foresight"] is None
    capsys.readouterr()
    assert main(["eval", str(out / "tokenppo.zip"), "--env", "BugFix-v1", "--split", "test", "--episodes", "1",
                 "--baselines", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report["baselines"]) == {"debugger", "brute_force"} and report["foresight"] is None
    assert report["n_tasks"] == len(split_problems("test")) and "pass_after_test_calls" in report
    # greedy decoding: the run evaluated both weights that way too, and eval --greedy is seed-free
    assert results["trained_greedy"]["episodes"] == results["base_greedy"]["episodes"] == report["n_tasks"]
    greedy = []
    for seed in ("0", "5"):
        assert main(["eval", str(out / "tokenppo.zip"), "--env", "BugFix-v1", "--split", "test", "--episodes", "1",
                     "--greedy", "--seed", seed, "--json"]) == 0
        greedy.append(json.loads(capsys.readouterr().out))
    assert greedy[0]["decoding"] == "legal-call grammar, greedy"
    assert greedy[0]["pass_rate"] == greedy[1]["pass_rate"] and greedy[0]["mean_calls"] == greedy[1]["mean_calls"]


@pytest.mark.heavy
def test_an_interrupt_during_training_keeps_validations_best_and_still_evaluates(tmp_path, monkeypatch):
    from stable_baselines3.common.callbacks import BaseCallback

    from agents.bugfix.repair_v1 import train_repair

    class InterruptAt(BaseCallback):
        def __init__(self, iteration: int):
            super().__init__(0)
            self.at, self.done = iteration, 0

        def _on_rollout_end(self) -> None:
            self.done += 1
            if self.done == self.at:
                raise KeyboardInterrupt

        def _on_step(self) -> bool:
            return True

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path))
    recipe = with_changes(RepairRecipeV1(), d_model=16, n_layer=1, d_ff=32, base_demonstrations=2, base_steps=1,
                          iterations=50, n_episodes=2, n_envs=2, validation_every=1, validation_tasks=1,
                          eval_tasks=1)
    model, result = train_repair(recipe, seed=0, verbose=0, callbacks=[InterruptAt(3)])
    assert result.interrupted and 1 <= result.iterations < 50
    assert [it for it, _ in result.validation] == list(range(len(result.validation)))  # validated every iteration
    best = max(rate for _, rate in result.validation)
    assert result.kept_iteration == next(it for it, rate in result.validation if rate == best)  # the earliest best
    assert result.trained["episodes"] == len(split_problems("test")) and result.trained_greedy is not None


def test_cloning_reports_each_step_and_the_checkpoint_benchmark_rejects_bad_flags(tmp_path, monkeypatch, capsys):
    from tests.test_benchmarks import _load

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path))
    tok = ByteTokenizer()
    cfg = bav1.BaseAgentV1Config(demonstrations=1, steps=3, batch_size=1)
    seen: list[tuple[int, float]] = []
    agent = bav1.make_base_agent_v1(tok, TINY, 0, cfg, 40, on_step=lambda step, model, loss: seen.append(
        (step, loss)))
    assert [step for step, _ in seen] == [1, 2, 3] and all(loss > 0 for _, loss in seen)
    plain = bav1.make_base_agent_v1(tok, TINY, 0, cfg, 40)  # the callback changes nothing
    assert all(torch.equal(a, b) for a, b in zip(agent.state_dict().values(), plain.state_dict().values()))
    for bad, says in ((["--steps", "0"], "--steps"), (["--d-model", "0"], "model sizes"),
                      (["--weight-decay", "-1"], "weight_decay"), (["--n-head", "5"], "divisible")):
        with pytest.raises(SystemExit):
            _load("base_agent_v1").main(bad)
        assert says in capsys.readouterr().err
