"""Text from files made safe to show: one function, :func:`printable`.

A leaf (standard library only, nothing of BugFix), so every layer of ``agents`` may use it for
the text it quotes from model files, run folders and transcripts in its messages.
"""

from __future__ import annotations

import re

_UNPRINTABLE = re.compile(r"[^\x20-\x7e\n\t]")


def printable(text: str, limit: int | None = None) -> str:
    """``text`` with every character outside printable ASCII, ``\\n`` and ``\\t`` replaced by ``?`` (escape
    sequences included), cut at ``limit`` characters: safe to show on a terminal.

    :param text: any text, e.g. read from a file
    :param limit: the most characters kept (default: all)
    """
    text = str(text) if limit is None else str(text)[:limit]
    return _UNPRINTABLE.sub("?", text.replace("\r\n", "\n"))
