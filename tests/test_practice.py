"""Edit practice: transcripts of the edit ops on recombined train code, and the loss on their answers."""

from __future__ import annotations

import pytest
import torch

import bugfix_gym
from agents.model.tinyagent import TinyAgent, TinyAgentConfig
from agents.bugfix.practice import EditPractice


@pytest.fixture(scope="module")
def ftok() -> bugfix_gym.Tokenizer:
    return bugfix_gym.fixed_tokenizer()


def test_transcripts_are_read_then_three_edits_and_only_the_answers_are_targets(ftok):
    drills = EditPractice(ftok, 20, seed=0)
    assert len(drills) == 20 and drills.ids.shape == drills.owner.shape
    for ids, owner, mask, n in zip(drills.ids, drills.owner, drills.target_mask, drills.lengths):
        text = ftok.decode(ids[:n].tolist())
        assert text.startswith("fix the function f : . calls :") and text.count(" edit ") >= 3
        targets = ids[1:][mask.bool()].tolist()
        assert targets and set(owner[1:][mask.bool()].tolist()) == {bugfix_gym.OWNER_TOOL}
        words = ftok.decode(targets)
        assert words.count("no change") + words.count("changed line") == 3  # the three answers, nothing else
        assert "def" not in words.split()  # the source read is not a target
    assert torch.equal(EditPractice(ftok, 20, seed=0).ids, drills.ids)  # seeded


def test_the_loss_falls_when_trained_on(ftok):
    torch.manual_seed(0)
    model = TinyAgent(TinyAgentConfig(vocab_size=ftok.vocab_size))
    drills = EditPractice(ftok, 32, seed=1)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(20):
        loss = drills.loss(model, 8)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5


def test_no_transcripts_is_an_error(ftok):
    with pytest.raises(ValueError, match="at least one transcript"):
        EditPractice(ftok, 0)
