"""The base agent (book §6.2): seeded behaviour cloning that lands in the book's ranges, and its disk cache."""

from __future__ import annotations

import warnings

import pytest
import torch

import bugfix_gym
from agents.bugfix import base_agent as base_agent_module
from agents.bugfix.base_agent import cached_base_agent, make_base_agent
from agents.bugfix.evaluation import evaluate


def test_same_call_same_weights_and_seed_matters(tok):
    kw = dict(episodes_per_task=1, steps=3, batch_size=4)
    a, b = make_base_agent(tok, seed=7, **kw), make_base_agent(tok, seed=7, **kw)
    c = make_base_agent(tok, seed=8, **kw)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert any(not torch.equal(sa[k], sc[k]) for k in sa)


def test_progress_sees_every_step_and_changes_no_weight(tok):
    """The progress hook (the CLI's bars) is handed each loop's step count and cannot change the weights."""
    seen = []

    def progress(n, what):
        seen.append((n, what))
        return range(n)

    kw = dict(episodes_per_task=1, steps=3, batch_size=4, tool_coef=1.0, practice=8, practice_steps=2)
    quiet, shown = make_base_agent(tok, seed=7, **kw), make_base_agent(tok, seed=7, progress=progress, **kw)
    assert seen == [(2, "edit practice"), (3, "behaviour cloning")]
    assert all(torch.equal(a, b) for a, b in zip(quiet.state_dict().values(), shown.state_dict().values()))


def test_the_cache_key_follows_the_recipe_not_the_rest_of_the_module(tok, monkeypatch):
    """Editing the cache or progress code keeps cached agents; editing a recipe function retrains."""
    key = base_agent_module._base_agent_key(tok, dict(seed=0))
    monkeypatch.setattr(base_agent_module, "progress_bar", lambda n, what: range(n))
    assert base_agent_module._base_agent_key(tok, dict(seed=0)) == key
    monkeypatch.setattr(base_agent_module, "_adam_step", lambda opt, loss: None)
    assert base_agent_module._base_agent_key(tok, dict(seed=0)) != key


@pytest.mark.heavy
def test_tool_coef_also_teaches_the_tool_outputs(tok):
    """With ``tool_coef`` the agent learns to predict what the tools answer; at 0 it does not learn them."""
    from agents.model.tinyagent import sequence_log_probs
    from agents.rollout.trajectory import collate, scripted_rollout

    kw = dict(episodes_per_task=2, steps=40, batch_size=16, kinds=("careful",))
    plain, both = make_base_agent(tok, seed=3, **kw), make_base_agent(tok, seed=3, tool_coef=1.0, **kw)
    env = bugfix_gym.BugFixEnv(split="heldout")
    policy = bugfix_gym.scripted_policy("careful", seed=11)
    data = collate([scripted_rollout(policy, env, task, tok) for task in bugfix_gym.make_tasks("heldout")], tok.pad_id)
    tool = (data["owner"][:, 1:] == bugfix_gym.OWNER_TOOL).float()  # [N, T-1]
    with torch.no_grad():
        nll = {name: -float((sequence_log_probs(m, data["ids"]) * tool).sum() / tool.sum())
               for name, m in (("plain", plain), ("both", both))}
    assert nll["both"] < 0.7 * nll["plain"]  # held-out episodes: it learnt the tools, not these transcripts


@pytest.mark.heavy
def test_edit_practice_teaches_the_edits_answers_on_code_it_never_practised_on(tok):
    """Practice first, then behaviour cloning with practice kept: the answers of edits on fresh
    recombined code (another seed) are far better predicted than without practice."""
    from agents.bugfix.practice import EditPractice

    kw = dict(episodes_per_task=1, steps=5, batch_size=8, kinds=("careful",))
    ftok = bugfix_gym.fixed_tokenizer()
    plain = make_base_agent(ftok, seed=3, **kw)
    drilled = make_base_agent(ftok, seed=3, practice=100, practice_steps=25, practice_batch_size=16, **kw)
    with torch.no_grad():  # the same 64 draws of fresh transcripts for both
        nll = {name: float(EditPractice(ftok, 64, seed=99).loss(m, 64))
               for name, m in (("plain", plain), ("drilled", drilled))}
    assert nll["drilled"] < 0.6 * nll["plain"]
    with pytest.raises(ValueError, match="practice_steps"):
        make_base_agent(ftok, seed=3, practice=10, **kw)


@pytest.mark.slow
def test_base_agent_lands_in_the_books_ranges(shared_base_agent, tok):
    """Book: valid calls 0.98, submit 0.78-0.83, pass 0.12-0.19 on both splits (16 episodes per task)."""
    for split in ("train", "heldout"):
        stats = evaluate(shared_base_agent, bugfix_gym.make_tasks(split), 16, seed=0, tokenizer=tok)
        assert stats["valid_calls"] >= 0.90, (split, stats)
        assert 0.65 <= stats["submit_rate"] <= 0.95, (split, stats)
        assert 0.06 <= stats["pass_rate"] <= 0.30, (split, stats)
        assert 2.0 <= stats["turns"] <= 4.5, (split, stats)


def test_the_cache_reads_back_the_same_weights_and_survives_a_failed_write(tok, tmp_path, monkeypatch):
    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    kw = dict(episodes_per_task=1, steps=2, batch_size=4)
    first = cached_base_agent(tok, seed=3, **kw)
    files = list((tmp_path / "cache").glob("base_agent-*.pt"))
    assert len(files) == 1
    again = cached_base_agent(tok, seed=3, **kw)
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    files[0].write_bytes(b"corrupt")  # a corrupt cache file is retrained with a warning
    with pytest.warns(UserWarning, match="unreadable base-agent cache"):
        cached_base_agent(tok, seed=3, **kw)

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "full"))
    monkeypatch.setattr(base_agent_module.torch, "save", disk_full)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        agent = cached_base_agent(tok, seed=4, **kw)  # the caller still gets its agent
    assert agent is not None and any("could not write the base-agent cache" in str(w.message) for w in caught)
    assert list((tmp_path / "full").iterdir()) == []  # no temporary file left behind


def test_a_pickle_in_a_base_agent_cache_file_is_never_run_and_is_retrained(tok, tmp_path, monkeypatch, pickle_bomb):
    monkeypatch.setenv("BUGFIX_GYM_CACHE", str(tmp_path / "cache"))
    kw = dict(episodes_per_task=1, steps=2, batch_size=4)
    first = cached_base_agent(tok, seed=3, **kw)
    (path,) = (tmp_path / "cache").glob("base_agent-*.pt")
    blob = torch.load(path, weights_only=True)
    bomb, marker = pickle_bomb
    torch.save(dict(blob, state_dict=dict(blob["state_dict"], extra=bomb)), path)  # the cache's own layout
    with pytest.warns(UserWarning, match="unreadable base-agent cache.*UnpicklingError"):
        again = cached_base_agent(tok, seed=3, **kw)
    assert not marker.exists()
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(), again.state_dict().values()))
    assert "extra" not in torch.load(path, weights_only=True)["state_dict"]  # rewritten from the retrained agent
