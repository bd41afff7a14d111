"""A character-level tokenizer, for a text env that advertises no tokenizer of its own: one token per
character of its gymnasium ``Text`` spaces' charset, after the specials of :class:`bugfix_gym.Tokenizer`
(``<pad>``, ``<unk>``, ``<eoc>``, ...). The algorithms build it when nobody gives them a tokenizer
(:meth:`agents.algorithms.on_policy.TokenOnPolicyAlgorithm._prepare_policy_kwargs`)."""

from __future__ import annotations

from typing import Iterable, Sequence

from gymnasium import spaces

from bugfix_gym.contract.tokenizer import SPECIALS, Tokenizer
from bugfix_gym.contract.tokens import register_tokenizer_format

FORMAT = "agents.CharTokenizer/1"


class CharTokenizer(Tokenizer):
    """Character <-> id mapping: ``encode`` reads each character as a token (one outside the charset is
    ``<unk>``), ``decode`` joins them without separators; a call ends with ``<eoc>`` as in
    :class:`bugfix_gym.Tokenizer`.

    :param characters: the charset, in id order after the specials
    """

    def __init__(self, characters: Sequence[str]):
        if any(len(c) != 1 for c in characters):
            raise ValueError("a CharTokenizer's vocabulary is single characters")
        super().__init__(list(characters))

    def encode(self, text: str) -> list[int]:
        unk = self.unk_id
        return [self.ids.get(c, unk) for c in text]

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str:
        out = []
        for i in map(int, ids):
            if stop_at_eoc and i == self.eoc_id:
                break
            if 0 <= i < len(self.words) and self.words[i] not in SPECIALS:
                out.append(self.words[i])
        return "".join(out)

    def to_dict(self) -> dict:
        return {"format": FORMAT, "characters": self.words[len(SPECIALS):]}

    @classmethod
    def from_dict(cls, data: dict) -> "CharTokenizer":
        if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("characters"), list):
            raise ValueError(f"not a character tokenizer (expected format {FORMAT!r})")
        return cls(data["characters"])

    @classmethod
    def for_spaces(cls, *text_spaces: spaces.Space) -> "CharTokenizer | None":
        """The tokenizer of the charset of these gymnasium ``Text`` spaces (sorted), or None when none is one."""
        chars = {c for space in text_spaces if isinstance(space, spaces.Text) for c in space.character_set}
        return cls(sorted(chars)) if chars else None


register_tokenizer_format(FORMAT, CharTokenizer.from_dict)
