"""A word-level tokenizer built from the task library and the tool vocabulary.

Words are identifiers, numbers, operators and punctuation; a newline is a token of its
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
        or tool segment with ``<turn>`` (the policy writes next); :func:`bugfix_gym.tokens.encode_segment`."""
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


# A generic Python vocabulary, so that code the task library never showed still reads as code.
PYTHON_WORDS = (
    # keywords (keyword.kwlist of Python 3.11, written out so the vocabulary does not depend on the interpreter)
    "False None True and as assert async await break class continue def del elif else except finally for "
    "from global if import in is lambda nonlocal not or pass raise return try while with yield "
    # common builtins
    "abs all any bool dict divmod enumerate filter float int isinstance len list map max min pow print "
    "range reversed round set sorted str sum tuple zip "
    # operators and punctuation (as split_words splits them)
    "+ - * / // % ** == != < <= > >= = += -= *= /= ( ) [ ] { } , : . -> ' \" ; @ & | ^ ~ !"
)
SMALL_INTS = 129  # 0 .. 128 are words; larger numbers and most floats are <unk>


def fixed_tokenizer() -> Tokenizer:
    """The fixed vocabulary for generated and unseen tasks (it does not grow with the tasks played).

    Words, in this order (first-seen order, so the ids are deterministic): the tool vocabulary
    and the nine calls; a generic Python vocabulary (:data:`PYTHON_WORDS`: keywords, common
    builtins, operators including ``//``, ``%`` and ``**``) and the integers ``0 .. 128``; the
    book's 30 tasks (as :func:`build_tokenizer` reads them); the procedural generator's
    identifier pools and the words of its ``train`` templates (statements and sources).
    Nothing of the generator's ``heldout`` / ``test`` templates is read.

    Unknown words become ``<unk>``: every generated function name (``calc_widget_3fa2b1``: one
    identifier, never a word), identifiers outside the pools, statement words that only unseen
    templates or task packs use, numbers above 128 and most floats. The agent still sees where
    an unknown word stands (one ``<unk>`` per word) and everything around it; a call the policy
    writes can never contain one that the env would accept, since every call word is known.
    """
    from . import generator, tools
    from .tasks import make_tasks

    seen: dict[str, None] = {}

    def add(text: str) -> None:
        for w in split_words(text):
            seen.setdefault(w, None)

    add(tools.VOCABULARY_TEXT)
    add(PYTHON_WORDS)
    add(" ".join(str(i) for i in range(SMALL_INTS)))
    seen.update(dict.fromkeys(build_tokenizer(make_tasks("all")).words[len(SPECIALS):]))
    for pool in generator.WORDS.values():
        add(" ".join(pool))
    for template in generator.TEMPLATES["train"]:
        statements = (template.statement,) if isinstance(template.statement, str) else template.statement
        for text in (*statements, template.source):
            add(re.sub(r"\{(\w+)\}", r"\1", text))  # placeholders by their role names (also pool words)
    return Tokenizer(list(seen))
