"""TinyAgent on BugFix-v1: the legal-call grammar writes exactly the env's legal calls, the sampler follows it, a
from-scratch TokenPPO trains, saves and loads, and ``bugfix-gym eval --env BugFix-v1`` reports in one JSON object
(or refuses in one line)."""

from __future__ import annotations

import json
from functools import lru_cache

import numpy as np
import pytest
import torch

import bugfix_gym
from agents.bugfix.v1 import (UNLABELLED, V1_MAX_CALL_TOKENS, evaluate_v1, make_v1_env, new_v1_ppo,
                              one_task_per_problem, task_classes, v1_policy_kwargs)
from agents.cli import main
from agents.decoding.legal_calls import FALLBACK_CALLS, LegalCallGrammar
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.edits.defect_classes import FAMILIES

PACK = "examples/task_pack_v1_example.json"
TINY = dict(max_len=2048, d_model=16, n_layer=1, n_head=2, d_ff=32)


@lru_cache(maxsize=None)
def pack_tasks() -> tuple:
    return tuple(bugfix_gym.load_task_pack(PACK))


def writable(grammar: LegalCallGrammar, state: int) -> list[str]:
    """Every call the grammar lets the policy write from ``state``, by walking every allowed token."""
    out, todo = [], [(state, [])]
    while todo:
        node, prefix = todo.pop()
        for token in grammar.allowed_tokens(node):
            if token == grammar.eoc_id:
                out.append(grammar.tokenizer.decode(prefix))
            else:
                todo.append((grammar.step(node, token), prefix + [token]))
    return out


def states_after(env, calls):
    """The env reset on the pack's first task, then each of ``calls`` stepped; its legal calls after each."""
    env.reset(seed=0, options={"task": "running_max"})
    yield env.unwrapped.legal_calls()
    for call in calls:
        env.step(call)
        yield env.unwrapped.legal_calls()


def test_the_grammar_writes_every_legal_call_and_nothing_else():
    grammar = LegalCallGrammar(ByteTokenizer(), V1_MAX_CALL_TOKENS)
    env = BugFixEnvV1(tasks=list(pack_tasks()))
    seen = 0
    for legal in states_after(env, ["read", "edit 3.0 op -=", "delete 2"]):
        assert len(legal) > 5
        assert sorted(writable(grammar, grammar.start_for(legal))) == sorted(legal)
        seen += "revert" in legal
    assert seen == 2  # after the edit and the delete: revert is legal, and writable


def test_rows_step_and_forced_agree_and_a_wrong_token_is_refused():
    tok = ByteTokenizer()
    grammar = LegalCallGrammar(tok, V1_MAX_CALL_TOKENS)
    env = BugFixEnvV1(tasks=list(pack_tasks()))
    env.reset(seed=0, options={"task": "running_max"})
    legal = env.legal_calls()
    state = grammar.start_for(legal)
    for char in "edit ":
        row = grammar.rows(torch.tensor([state]))[0]
        assert row.nonzero().flatten().tolist() == sorted(grammar.allowed_tokens(state))
        (token,) = tok.encode(char)
        state = grammar.step(state, token)
    digits = sorted({call[5] for call in legal if call.startswith("edit ")})  # the lines' first digits
    assert grammar.tokenizer.decode(sorted(grammar.allowed_tokens(state))) == "".join(digits)
    assert grammar.forced(state) == (tok.encode(digits[0])[0] if len(digits) == 1 else None)
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(state, tok.encode("x")[0])
    with pytest.raises(ValueError, match="not allowed"):
        grammar.step(state, tok.eoc_id)  # "edit " is no call
    logits = grammar.mask_logits(torch.zeros(2, tok.vocab_size), torch.tensor([state, -1]))
    assert torch.isinf(logits[0]).sum() == tok.vocab_size - len(grammar.allowed_tokens(state))
    assert not torch.isinf(logits[1]).any()  # no grammar state: unconstrained


def test_calls_longer_than_the_limit_are_left_out_and_forgotten_turns_are_refused():
    grammar = LegalCallGrammar(ByteTokenizer(), max_call_tokens=6, memory_bytes=1)
    first = grammar.start_for(["read", "test", "revert", "edit 3.0 op -="])
    assert sorted(writable(grammar, first)) == ["read", "test"]
    assert sorted(writable(grammar, grammar.start)) == sorted(c for c in FALLBACK_CALLS if len(c) < 6)
    for k in range(3):
        grammar.start_for(["read", f"delete {k + 1}"])
    with pytest.raises(ValueError, match="forgot"):
        grammar.allowed_tokens(first)


def test_sampled_episodes_write_only_legal_calls():
    model = new_v1_ppo(n_envs=2, env_kwargs=dict(tasks=list(pack_tasks()), max_turns=4), model_sizes=TINY,
                       n_episodes=4, batch_size=4, n_epochs=1)
    tasks = list(pack_tasks())[:4]
    from agents.bugfix.v1 import play_v1

    trajs = play_v1(model, tasks, 2, seed=1, env_kwargs=dict(max_turns=4))
    assert len(trajs) == 8
    for traj in trajs:
        assert not traj.info.get("context_cut")
        assert traj.info["n_invalid"] == 0 and len(traj.info["actions"]) >= 1
    kinds = {a.split()[0] for t in trajs for a in t.info["actions"]}
    assert kinds <= {"read", "test", "locate", "edit", "delete", "revert", "submit"}


def test_defect_classes_come_from_the_injected_family_and_a_split_gives_one_task_per_function():
    split = BugFixEnvV1(split="test").tasks
    chosen = one_task_per_problem(split)
    assert len(chosen) == len({t.problem for t in split}) == len({t.problem for t in chosen})
    assert chosen == one_task_per_problem(list(reversed(split)))  # the same draw whatever the order
    for task in chosen:
        assert task.bugs and set(task_classes(task)) == {c for bug in task.bugs for c in FAMILIES[bug.family]}
    assert len({task_classes(t) for t in chosen}) > 3  # spread over the families
    assert task_classes(pack_tasks()[0]) == (UNLABELLED,)  # a pack's real bug names no family


def test_policy_kwargs_refuse_a_fixed_grammar_with_legal_calls():
    from agents.algorithms.ppo import TokenPPO

    kwargs = dict(v1_policy_kwargs(**TINY), call_grammar=["read"])
    with pytest.raises(ValueError, match="legal_calls=True"):
        TokenPPO("TinyAgentPolicy", make_v1_env(tasks=list(pack_tasks())), policy_kwargs=kwargs, base_agent=None)


@pytest.fixture(scope="module")
def trained_v1(tmp_path_factory):
    """A tiny from-scratch TokenPPO trained for one iteration on the pack's tasks, saved. Its first ratios are 1: the
    trainer masks the logits with the grammar states the sampler recorded, so it scores what was sampled."""
    torch.manual_seed(0)
    model = new_v1_ppo(n_envs=2, seed=0, env_kwargs=dict(tasks=list(pack_tasks()), max_turns=3), model_sizes=TINY,
                       n_episodes=4, batch_size=4, n_epochs=1)
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(4)
    assert model._n_updates >= 1
    first = model.diagnostics[-1]["epochs"][0]  # one minibatch: scored before any step, under the sampling masks
    assert abs(first["ratio_min"] - 1) < 1e-4 and abs(first["ratio_max"] - 1) < 1e-4
    moved = any(not torch.equal(a, b) for a, b in zip(before, model.policy.parameters()))
    path = tmp_path_factory.mktemp("v1") / "tiny_v1.zip"
    model.save(path)
    return path, moved


def test_train_save_eval_round_trip(trained_v1, capsys):
    path, moved = trained_v1
    assert moved  # the update changed the weights
    from agents.algorithms.presets import load_algorithm

    loaded = load_algorithm(path)
    assert isinstance(loaded.policy.grammar, LegalCallGrammar) and loaded.policy.legal_calls
    stats = evaluate_v1(loaded, list(pack_tasks())[:2], 1, env_kwargs=dict(max_turns=3))
    assert stats["episodes"] == 2 and 0.0 <= stats["pass_rate"] <= 1.0 and stats["valid_calls"] == 1.0
    assert main(["eval", str(path), "--env", "BugFix-v1", "--pack", PACK, "--episodes", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {"pass_rate", "mean_calls", "mean_test_calls", "per_class", "per_task", "foresight", "env",
            "episodes_per_task", "n_tasks"} <= set(out)
    assert out["foresight"] is None and out["env"] == "BugFix-v1" and out["n_tasks"] == len(pack_tasks())
    assert out["per_class"] == {UNLABELLED: {"pass_rate": out["pass_rate"], "episodes": len(pack_tasks())}}
    assert np.isclose(sum(len(r) for r in [out["per_task"]]), len(pack_tasks()))


@pytest.mark.parametrize("argv, says", [
    (["--env", "BugFix-v0"], "evaluate it with --env BugFix-v1"),
    (["--env", "BugFix-v9"], "invalid choice"),
    (["--env", "BugFix-v1", "--split", "nope"], "invalid choice"),
    (["--env", "BugFix-v1", "--generated", "test"], "--generated is BugFix-v0's"),
    (["--env", "BugFix-v1", "--pack", "examples/task_pack_example.json"], "BugFix-v1 plays v1 packs"),
])
def test_eval_v1_refuses_in_one_line(trained_v1, argv, says, capsys):
    assert main(["eval", str(trained_v1[0]), *argv, "--json"]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1


def test_eval_v1_refuses_a_bad_model_file_in_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.zip"
    bad.write_bytes(b"not a zip")
    assert main(["eval", str(bad), "--env", "BugFix-v1", "--split", "test", "--json"]) == 2
    err = capsys.readouterr().err
    assert "not a bugfix-gym model file" in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_eval_v1_on_the_test_split(trained_v1, capsys):
    assert main(["eval", str(trained_v1[0]), "--env", "BugFix-v1", "--split", "test", "--episodes", "1",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["n_tasks"] == 32 and out["episodes"] == 32 and out["foresight"] is None
    assert sum(row["episodes"] for row in out["per_class"].values()) >= 32  # a task of two classes counts twice
    assert 0.0 <= out["pass_rate"] <= 1.0 and out["mean_calls"] >= 1 and out["mean_test_calls"] >= 0


def test_the_grammar_benchmark_runs(capsys):
    import importlib.util
    import pathlib

    path = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "tinyagent_v1.py"
    spec = importlib.util.spec_from_file_location("tinyagent_v1_bench", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    assert bench.main(["grammar", "--states", "3"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["states"] == 3 and row["legal_calls_mean"] > 5 and row["table_ms"] > 0
