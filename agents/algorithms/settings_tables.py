"""The settings tables of the docs, generated from their one definition: the config dataclasses'
fields (:mod:`agents.algorithms.config`) and the presets (:mod:`agents.algorithms.presets`).

A doc holds each table between ``<!-- generated: NAME -->`` and ``<!-- end generated -->``;
:func:`render` rewrites those regions, ``python -m agents.algorithms.settings_tables FILE...``
writes the files back (``make docs-tables``), and tests/test_settings_tables.py fails when a doc
has drifted from the definitions.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Callable

from agents.algorithms.config import OnPolicyConfig, PPOConfig, ReinforceConfig

REGION = re.compile(r"(<!-- generated: (\w+) -->\n)(.*?)(<!-- end generated -->)", re.S)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def settings_table(config: type, only_own: bool = False) -> str:
    """A Markdown table of ``config``'s fields: name, default, what it is, saved with a model.

    :param config: a config dataclass
    :param only_own: only the fields ``config`` declares or redeclares (not those it inherits unchanged)
    """
    base = {f.name: f for f in dataclasses.fields(OnPolicyConfig)}
    rows = ["| setting | default | meaning | saved |", "|---|---|---|---|"]
    for field in dataclasses.fields(config):
        inherited = field.name in base and base[field.name].default == field.default and \
            base[field.name].metadata["help"] == field.metadata["help"]
        if only_own and inherited and config is not OnPolicyConfig:
            continue
        saved = "yes" if field.metadata.get("saved", True) else "no"
        rows.append(f"| `{field.name}` | `{field.default!r}` | {_cell(field.metadata['help'])} | {saved} |")
    return "\n".join(rows) + "\n"


def presets_table() -> str:
    """A Markdown table of the named algorithms: name, class, what it is, its settings (a delta over the class's
    defaults)."""
    from agents.algorithms.presets import ALGORITHMS, describe

    rows = ["| name | class | what it is | its settings |", "|---|---|---|---|"]
    for name, preset in ALGORITHMS.items():
        settings = describe(name) or "(the class defaults)"
        rows.append(f"| `{name}` | {preset.cls.__name__} | {_cell(preset.summary)} | {_cell(settings)} |")
    return "\n".join(rows) + "\n"


TABLES: dict[str, Callable[[], str]] = {
    "PPOConfig": lambda: settings_table(PPOConfig),
    "ReinforceConfig": lambda: settings_table(ReinforceConfig, only_own=True),
    "presets": presets_table,
}


def render(text: str) -> str:
    """``text`` with every generated region rewritten from the definitions; an unknown table name is a
    ``KeyError`` naming it."""
    def table(match: re.Match) -> str:
        name = match.group(2)
        if name not in TABLES:
            raise KeyError(f"no generated table {name!r}; known: {', '.join(TABLES)}")
        return match.group(1) + TABLES[name]() + match.group(4)

    return REGION.sub(table, text)


def main(paths: list[str]) -> int:
    """Rewrite the generated regions of each file; print the files that changed."""
    for path in map(Path, paths):
        text = path.read_text()
        new = render(text)
        if new != text:
            path.write_text(new)
            print(f"rewrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
