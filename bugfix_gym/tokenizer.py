"""A word-level tokenizer built from the task library and the tool vocabulary.

Words are identifiers, numbers, operators and punctuation; a newline is a token of its
own (``<nl>``) so that source code keeps its lines. Specials: ``<pad>`` (0), ``<unk>``,
``<eoc>`` (end of call, ends every policy turn); pad and end-of-call differ.
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Sequence

PAD, UNK, EOC, NL = "<pad>", "<unk>", "<eoc>", "<nl>"
SPECIALS = (PAD, UNK, EOC, NL)

_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*|\d+(?:\.\d+)?|==|!=|<=|>=|\+=|-=|\*=|/=|//|\*\*|->|\n|[^\w\s]")


def split_words(text: str) -> list[str]:
    """Text -> words (newlines become ``<nl>``)."""
    return [NL if w == "\n" else w for w in _WORD.findall(text)]


class Tokenizer:
    """Word <-> id mapping.

    :param words: the vocabulary after the specials, in id order
    """

    def __init__(self, words: Sequence[str]):
        self.words: list[str] = list(SPECIALS) + [w for w in words if w not in SPECIALS]
        self.ids: dict[str, int] = {w: i for i, w in enumerate(self.words)}
        if len(self.ids) != len(self.words):
            raise ValueError("tokenizer vocabulary has duplicate words")
        self.pad_id, self.unk_id, self.eoc_id = self.ids[PAD], self.ids[UNK], self.ids[EOC]

    @property
    def vocab_size(self) -> int:
        return len(self.words)

    def encode(self, text: str) -> list[int]:
        unk = self.unk_id
        return [self.ids.get(w, unk) for w in split_words(text)]

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str:
        """Ids -> text, words joined by spaces (``<nl>`` back to a newline), up to ``<eoc>``."""
        out = []
        for i in ids:
            i = int(i)
            if stop_at_eoc and i == self.eoc_id:
                break
            if i == self.pad_id:
                continue
            word = self.words[i] if 0 <= i < len(self.words) else UNK
            out.append("\n" if word == NL else word)
        return " ".join(out).replace(" \n ", "\n")

    def to_dict(self) -> dict:
        return {"format": "bugfix_gym.Tokenizer/1", "words": self.words}

    @classmethod
    def from_dict(cls, data: dict) -> "Tokenizer":
        if not isinstance(data, dict) or data.get("format") != "bugfix_gym.Tokenizer/1":
            raise ValueError("not a bugfix_gym tokenizer (expected format 'bugfix_gym.Tokenizer/1')")
        return cls(data["words"][len(SPECIALS):])

    def save(self, path) -> None:
        with open(path, "w") as f:
            json.dump(self.to_dict(), f)

    @classmethod
    def load(cls, path) -> "Tokenizer":
        with open(path) as f:
            return cls.from_dict(json.load(f))

    def __eq__(self, other) -> bool:
        return isinstance(other, Tokenizer) and self.words == other.words

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"


def build_tokenizer(tasks=None) -> Tokenizer:
    """Vocabulary from the tool vocabulary plus every task's statement, sources, and test values.

    Words are kept in first-seen order, so the same tasks always give the same ids.
    """
    from . import tools
    from .ops import FIX_OPS, apply_op
    from .tasks import make_tasks

    tasks = make_tasks("all") if tasks is None else list(tasks)
    seen: dict[str, None] = {}

    def add(text: str) -> None:
        for w in split_words(text):
            seen.setdefault(w, None)

    add(tools.VOCABULARY_TEXT)
    for task in tasks:
        add(tools.prompt(task))
        add(task.source)
        for op in FIX_OPS:  # every source one edit away, so reads after an edit stay in vocabulary
            add(apply_op(task.source, op))
        for args, expected in task.hidden:
            add(repr(args) + " " + repr(expected))
    return Tokenizer(list(seen))
