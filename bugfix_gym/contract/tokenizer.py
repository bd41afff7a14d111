"""A word-level tokenizer: words <-> ids, with the specials every token view needs.

Generic (standard library only): the vocabulary BugFix builds from its task library and tool words is
:mod:`bugfix_gym.core.vocabulary`. Words are identifiers, numbers, operators and punctuation; a newline is a
token of its
own (``<nl>``) so that source code keeps its lines. Specials: ``<pad>`` (0), ``<unk>``,
``<eoc>`` (end of call, ends every policy turn; pad and end-of-call differ) and ``<turn>``
(ends every prompt and tool segment: the policy's turn always starts right after it).
"""

from __future__ import annotations

import json
import re
from typing import Iterable, Sequence

PAD, UNK, EOC, NL, TURN = "<pad>", "<unk>", "<eoc>", "<nl>", "<turn>"
SPECIALS = (PAD, UNK, EOC, NL, TURN)
FORMAT = "bugfix_gym.Tokenizer/2"  # /1 had no <turn>

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
        self.turn_id = self.ids[TURN]

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

    def segment_ids(self, owner: int, text: str) -> list[int]:
        """One transcript segment -> ids: a policy segment (owner 2, a call) ends with ``<eoc>``, a prompt
        or tool segment with ``<turn>`` (the policy writes next); :func:`bugfix_gym.contract.tokens.encode_segment`."""
        ids = self.encode(text)
        ids.append(self.eoc_id if owner == 2 else self.turn_id)
        return ids

    def to_dict(self) -> dict:
        return {"format": FORMAT, "words": self.words}

    @classmethod
    def from_dict(cls, data: dict) -> "Tokenizer":
        if isinstance(data, dict) and data.get("format") == "bugfix_gym.Tokenizer/1":
            raise ValueError("this tokenizer was saved before the <turn> marker existed (format "
                             "'bugfix_gym.Tokenizer/1'); its model cannot read the current token stream: retrain it")
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ValueError(f"not a bugfix_gym tokenizer (expected format {FORMAT!r})")
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
