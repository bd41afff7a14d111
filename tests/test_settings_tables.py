"""The settings tables of docs/ppo.md and docs/algorithms.md are generated from the config dataclasses and the
presets (agents/algorithms/settings_tables.py): a doc that drifts from them fails here."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from agents.algorithms.config import PPOConfig
from agents.algorithms.settings_tables import render, settings_table

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize("doc", ["ppo.md", "algorithms.md"])
def test_the_docs_settings_tables_are_what_the_definitions_generate(doc):
    text = (DOCS / doc).read_text()
    assert "<!-- generated: " in text
    assert render(text) == text, f"docs/{doc} drifted: run make docs-tables"


def test_every_setting_has_a_row_with_its_default_and_a_changed_default_changes_the_table():
    table = settings_table(PPOConfig)
    for field in dataclasses.fields(PPOConfig):
        assert f"| `{field.name}` | `{field.default!r}` |" in table
    for name in ("group_size", "drop_zero_variance_groups", "max_resample_rounds"):  # the rows the hand table lacked
        assert f"| `{name}` |" in (DOCS / "ppo.md").read_text()

    @dataclasses.dataclass
    class Drifted(PPOConfig):
        n_epochs: int = dataclasses.field(default=5, metadata=dict(help="passes over each batch", saved=True))

    assert "| `n_epochs` | `5` |" in settings_table(Drifted) and "| `n_epochs` | `4` |" not in settings_table(Drifted)
    doc = "a\n<!-- generated: PPOConfig -->\n| stale |\n<!-- end generated -->\nb\n"
    assert "| stale |" not in render(doc) and render(doc).startswith("a\n") and render(doc).endswith("b\n")
    with pytest.raises(KeyError, match="no generated table 'Nope'"):
        render("<!-- generated: Nope -->\n<!-- end generated -->")
