"""DAgger for the v1 base agent: the debugger continued from any transcript, the rows it labels, and cloning on
them."""

from __future__ import annotations

import pytest
import torch

from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, encode_segment
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.scripted_v1 import make_policy

from agents.bugfix import base_agent_v1 as bav1
from agents.bugfix import dagger_v1 as dagger
from agents.rollout.trajectory import EpisodeRecord

TOK = ByteTokenizer()
MAX_LEN, MAX_CALL = 4096, 40


def _episode(kind: str, env: BugFixEnvV1, task):
    """``kind``'s scripted episode on ``task``, tokenized as the sampler records it (no cut: ``MAX_LEN`` is
    large)."""
    policy = make_policy(kind, max_turns=env.max_turns)
    policy.reset(0)
    obs, info = env.reset(options={"task": task})
    ep = EpisodeRecord(encode_segment(TOK, OWNER_PROMPT, obs))
    done = False
    while not done:
        call = policy(obs, info, env.legal_calls)
        obs, reward, terminated, truncated, info = env.step(call)
        done = terminated or truncated
        ep.add_call(encode_segment(TOK, OWNER_POLICY, call))
        ep.add_reward(reward)
        ep.add_tool(encode_segment(TOK, OWNER_TOOL, str(obs)))
    return ep.trajectory(info)


@pytest.fixture(scope="module")
def tasks():
    return bav1.demonstration_tasks(6, seed=3)


def test_the_debugger_continued_from_its_own_transcripts_makes_its_own_calls(tasks):
    env = BugFixEnvV1(split="train", bugs=1, max_turns=12)
    for task in tasks:
        traj = _episode("debugger", env, task)
        calls = list(traj.info["actions"])
        assert dagger.relabel(env, task, calls) == calls
        rows = dagger.labelled_sequences(traj, calls, TOK, MAX_LEN, MAX_CALL)
        assert len(rows) == 1  # every call agrees: one row, the episode up to its last call
        (row,) = rows
        n = len(row["ids"])
        assert torch.equal(row["ids"], traj.ids[:n]) and torch.equal(row["policy_mask"], traj.policy_mask[:n - 1])


def test_rows_of_another_players_episode_end_at_each_difference_with_the_debuggers_call(tasks):
    env = BugFixEnvV1(split="train", bugs=1, max_turns=12)
    task = tasks[0]
    traj = _episode("brute_force", env, task)
    calls = list(traj.info["actions"])
    labels = dagger.relabel(env, task, calls)
    assert calls[0] == labels[0] == "read" and labels[1] == "test" != calls[1]  # brute force edits after read
    rows = dagger.labelled_sequences(traj, labels, TOK, MAX_LEN, MAX_CALL)
    differ = [label for call, label in zip(calls, labels) if call != label]
    assert len(rows) == len(differ) + (calls[-1] == labels[-1])
    for row, label in zip(rows, differ):
        ids, mask = row["ids"], row["policy_mask"]
        assert TOK.decode(ids[-len(label) - 1:].tolist()) == label  # the row ends with the debugger's call
        targets = ids[1:][mask.bool()].tolist()
        assert TOK.decode(targets[-len(label) - 1:]) == label
    first = rows[0]
    assert TOK.decode(first["ids"][first["policy_mask"].nonzero()[0, 0] + 1:][:5].tolist()) == "read"  # agreed
    assert float(first["policy_mask"].sum()) == len("read") + 1 + len("test") + 1


@pytest.mark.parametrize("history, left, changed, expected", [
    ([], 12, False, "read"),
    ([("read", "..."), ("edit 3.1 op +", "changed")], 10, True, "test"),  # the opening's test, on the edit
    ([("read", "."), ("test", "0 / 2 passed"), ("locate", "."), ("edit 3.1 op +", "."), ("test", "visible tests : "
                                                                                         "0 / 2 passed")], 7, True,
     "revert"),
    ([("read", "."), ("test", "visible tests : 2 / 2 passed")], 10, False, "submit"),
    ([("read", "."), ("test", "."), ("locate", ".")], 1, False, "submit"),
    ([("read", "."), ("test", "."), ("locate", ".")], 2, False, "submit"),  # fewer than 3 turns: no new edit
])
def test_the_debuggers_next_call_from_any_situation(history, left, changed, expected):
    assert dagger.debugger_next(history, left, changed, lambda: ["read", "test", "locate", "edit 3.1 op -"]) \
        == expected


def test_an_untried_edit_comes_next_and_tried_ones_are_skipped():
    legal = ["read", "test", "locate", "edit 3.1 op -", "edit 4.1 op -"]
    located = "suspicious lines (Ochiai, 1 / 2 visible tests failing) : line 4 0.71 , line 3 0.50"
    history = [("read", "."), ("test", "."), ("locate", located)]
    assert dagger.debugger_next(history, 9, False, lambda: legal) == "edit 4.1 op -"  # the top-scored line first
    history += [("edit 4.1 op -", "."), ("test", "."), ("revert", ".")]
    assert dagger.debugger_next(history, 6, False, lambda: legal) == "edit 3.1 op -"
    history += [("edit 3.1 op -", "."), ("test", "."), ("revert", ".")]
    assert dagger.debugger_next(history, 3, False, lambda: legal) == "submit"  # none left


def test_cloning_on_the_joined_rows_lowers_their_loss(tasks):
    from agents.model.tinyagent import TinyAgent, TinyAgentConfig

    env = BugFixEnvV1(split="train", bugs=1, max_turns=12)
    trajs = [_episode("brute_force", env, t) for t in tasks[:2]]
    rows, stats = dagger.dagger_rows(trajs, tasks[:2], TOK, MAX_LEN, MAX_CALL, 12)
    assert stats["rows"] == len(rows) > 0 and 0 < stats["agreement"] < 1 and stats["edit_agreement"] <= 1
    own = dagger.stack_rows([r for t, task in zip(trajs[:1], tasks) for r in dagger.labelled_sequences(
        _episode("debugger", env, task), dagger.relabel(env, task, _episode("debugger", env, task).info["actions"]),
        TOK, MAX_LEN, MAX_CALL)], TOK.pad_id)
    data = dagger.join(own, dagger.stack_rows(rows, TOK.pad_id), TOK.pad_id)
    assert data["ids"].shape[0] == 1 + len(rows) and data["policy_mask"].shape[1] == data["ids"].shape[1] - 1
    config = TinyAgentConfig(vocab_size=TOK.vocab_size, d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=MAX_LEN)
    torch.manual_seed(0)
    model = TinyAgent(config)
    before = _loss(model, data)
    bav1.clone(model, data, bav1.BaseAgentV1Config(steps=30, batch_size=4, lr=3e-3), seed=0)
    assert _loss(model, data) < 0.8 * before


def _loss(model, data) -> float:
    from agents.algorithms.losses import masked_mean
    from agents.model.tinyagent import sequence_log_probs

    with torch.no_grad():
        return float(-masked_mean(sequence_log_probs(model, data["ids"]), data["policy_mask"]))


def test_the_dagger_benchmark_rejects_bad_flags(capsys):
    from tests.test_benchmarks import _load

    for bad in (["--rounds", "0"], ["--lr", "0"], ["--episodes", "-1"]):
        with pytest.raises(SystemExit):
            _load("dagger_v1").main(bad)
        assert "must be positive" in capsys.readouterr().err
