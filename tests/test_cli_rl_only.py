"""``bugfix-gym train --tasks generated --rl-only``: the recipe whose model decodes under the call grammar
alone; training rolls out with the agent's own foresight as a teacher and distils it into the policy."""

from __future__ import annotations

import json

import pytest
import torch

import agents.cli.report
import bugfix_gym
from agents.algorithms.ppo import TokenPPO
from agents.bugfix.aux_losses import ForesightDistillLoss, aux_losses_from_settings, edit_op_mask
from agents.cli import main
from agents.cli.parser import build_parser
from agents.cli.settings import train_settings
from agents.decoding.foresight import Foresight
from agents.decoding.grammar import CallGrammar
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL
from bugfix_gym.core.env import BugFixEnv


#: foresight's words, as BugFix-v0 advertises them to its agents
WORDS = BugFixEnv.metadata["agent_defaults"]["foresight"]


def _settings(*flags: str) -> dict:
    return train_settings(build_parser().parse_args(["train", "--tasks", "generated", *flags]))


def test_rl_only_decodes_with_the_grammar_alone_and_can_distil_foresight_in_training():
    plain, rl_only = _settings(), _settings("--rl-only")
    assert plain["call_mask"] == "useful_calls" and plain["foresight"] == 0.5 and "rollout_foresight" not in plain
    assert rl_only["call_mask"] == "call_mask" and rl_only["foresight"] is None and rl_only["rl_only"] is True
    assert rl_only["rollout_foresight"] is None and "distill" not in rl_only["ppo"]
    taught = _settings("--rl-only", "--rollout-foresight", "0.5")
    assert taught["foresight"] is None and taught["rollout_foresight"] == 0.5 and taught["ppo"]["distill"] > 0
    names = [aux.name for aux in aux_losses_from_settings(tool_coef=1.0, practice=4, distill=0.5)]
    assert names == ["tool", "practice", "distill"]
    assert [aux.name for aux in aux_losses_from_settings(tool_coef=1.0)] == ["tool"]


@pytest.mark.parametrize("flags, says", [
    (["--rl-only", "--foresight", "0.5"], "drop --foresight"),
    (["--rl-only", "--call-mask", "useful_calls"], "drop --foresight"),
    (["--rollout-foresight", "0.5"], "add --rl-only"),
    (["--rl-only", "--rollout-foresight", "0.5", "--tool-coef", "0"], "needs a --tool-coef above 0"),
    (["--rl-only", "--rollout-foresight", "0"], "the foresight threshold must be in (0, 1], got 0.0"),
])
def test_rl_only_refuses_hand_rule_decoding_in_one_line(flags, says, capsys):
    assert main(["train", "--tasks", "generated", *flags, "--out", "unused"]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_rl_only_needs_the_generated_recipe(capsys):
    assert main(["train", "--rl-only", "--out", "unused"]) == 2
    assert "--rl-only is a variant of --tasks generated" in capsys.readouterr().err


def test_edit_op_mask_marks_the_op_after_each_policy_edit(tok):
    ids = torch.tensor([tok.encode("edit fix_init") + tok.encode("edit fix_init") + tok.encode("edit swap_minmax")])
    owner = torch.tensor([[OWNER_POLICY, OWNER_POLICY, OWNER_TOOL, OWNER_TOOL, OWNER_POLICY, OWNER_POLICY]])
    # targets ids[1:]: the ops the policy wrote after its own edit, not the tool's "edit fix_init"
    assert edit_op_mask(ids, owner, tok.ids["edit"]).tolist() == [[1.0, 0.0, 0.0, 0.0, 1.0]]
    prompt = owner.clone()
    prompt[0, 4] = OWNER_PROMPT  # an "edit" the prompt wrote: its next token is no op the policy chose
    assert edit_op_mask(ids, prompt, tok.ids["edit"]).tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    loss = ForesightDistillLoss(1.0)
    loss.setup(tok, 0)
    logp = torch.tensor([[-0.5, -9.0, -9.0, -9.0, -1.5]])
    assert loss.loss(None, logp, loss.target_mask(ids, owner), 1).item() == pytest.approx(1.0)  # -mean(-0.5, -1.5)
    with pytest.raises(ValueError, match="distillation weight"):
        ForesightDistillLoss(0.0)


def test_teaching_foresight_closes_ops_for_sampling_but_records_the_grammars_state(tok):
    """With ``teach``, each op is sampled among those foresight leaves open (one, at a threshold below
    every prediction: probability 1), but the recorded state, what the trainer scores under, is the
    grammar's alone: the ops keep their probability without foresight, which the distillation raises."""
    from tests.test_rollout import _sample

    from agents.model.tinyagent import TinyAgent, score_tokens
    from agents.rollout.trajectory import collate

    torch.manual_seed(0)
    model = TinyAgent(tok.vocab_size).eval()
    grammar = CallGrammar(tok, bugfix_gym.CALLS)
    teacher = Foresight(grammar, tok, 1e-12, teach=True, **WORDS)
    batch = collate(_sample(model, tok, bugfix_gym.make_tasks("train")[:8] * 2, seed=5, grammar=grammar,
                            foresight=teacher), tok.pad_id)
    at_op = edit_op_mask(batch["ids"], batch["owner"], tok.ids["edit"]).bool()
    assert at_op.sum() >= 8  # edits were written
    assert batch["sample_logp"][at_op].abs().max() < 1e-6  # sampled with one op open
    assert (batch["grammar_state"][at_op] < grammar.n_nodes).all()  # recorded: no op closed
    with torch.no_grad():
        logp, _, _ = score_tokens(model, batch["ids"], batch["policy_mask"], grammar=grammar,
                                  grammar_state=batch["grammar_state"])
    assert logp[at_op].max() < -0.1  # scored under the grammar alone: five ops open
    calls = ~at_op & (batch["policy_mask"] > 0)  # every other policy token is scored as it was sampled
    assert ((logp - batch["sample_logp"]) * calls).abs().max() < 1e-5


@pytest.fixture
def small_rl_only(tmp_path, monkeypatch):
    """The generalisation recipe cut to a test's size (base agent, practice, validation, the table)."""
    from agents.bugfix.recipes import RECIPES

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(agents.cli.report, "GENERATED_EVAL", dict(n=4, gen_seed=0))
    recipe = RECIPES["generated"]
    monkeypatch.setitem(RECIPES, "generated", dict(
        recipe, validation=dict(generated="heldout", n=3, gen_seed=77, every=1),
        base_agent=dict(recipe["base_agent"], n_tasks=10, steps=2, practice=20, practice_steps=2),
        ppo=dict(recipe["ppo"], practice=20)))


@pytest.mark.heavy
@pytest.mark.parametrize("teacher", [[], ["--rollout-foresight", "0.5"]])
def test_rl_only_trains_and_saves_a_model_whose_eval_json_says_grammar_only(
        teacher, tmp_path, small_rl_only, capsys, monkeypatch):
    import agents.bugfix.evaluation

    decoded_with = []  # the foresight each evaluation decodes with: validation and the before/after table
    original = agents.bugfix.evaluation.evaluate

    def spy_evaluate(model, tasks, episodes_per_task=1, seed=0, **kwargs):
        decoded_with.append((kwargs.get("foresight", model.policy.foresight), model.policy.foresight is not None))
        return original(model, tasks, episodes_per_task, seed, **kwargs)

    monkeypatch.setattr(agents.bugfix.evaluation, "evaluate", spy_evaluate)
    out = tmp_path / "rl"
    assert main(["train", "--tasks", "generated", "--rl-only", *teacher, "--seed", "3", "--iterations", "2",
                 "--n-envs", "4", "--n-episodes", "8", "--n-minibatches", "2", "--eval-episodes", "1",
                 "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    assert decoded_with and all(foresight is None for foresight, _ in decoded_with)
    # a teacher's foresight is in the policy in training (validation decodes without it), gone when saved
    assert decoded_with[0][1] == bool(teacher) and not decoded_with[-1][1]
    assert sorted(p.name for p in out.glob("*.zip")) == ["tokenppo.zip"]
    model = TokenPPO.load(out / "tokenppo.zip")
    assert model.policy.foresight is None and model.policy.call_mask_key == "call_mask"
    assert [aux.name for aux in model.auxiliary_losses] == ["tool", "practice"] + ["distill"] * bool(teacher)
    results = json.loads((out / "results.json").read_text())
    assert results["settings"]["rollout_foresight"] == (0.5 if teacher else None)
    assert results["settings"]["foresight"] is None and results["settings"]["call_mask"] == "call_mask"
    for where in (["--generated", "test", "--n", "3", "--gen-seed", "5"],
                  ["--pack", "examples/task_pack_example.json", "--episodes", "1"]):
        assert main(["eval", str(out / "tokenppo.zip"), *where, "--json"]) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["foresight"] is None and report["call_mask"] == "call_mask"
        assert 0.0 <= report["pass_rate"] <= 1.0
