"""A byte-level tokenizer: every text is its UTF-8 bytes, so no identifier of real code is ever unknown.

The word-level :class:`bugfix_gym.contract.tokenizer.Tokenizer` knows the words of the v0 tasks; a HumanEval
function's identifiers (``numbers``, ``paren_string``) are ``<unk>`` in it, and an agent cannot write
``patch 3 return sorted(numbers)`` in ids at all. Here a text is its UTF-8 bytes, each byte one id, after four
specials: ``<pad>`` 0, ``<eoc>`` 1 (ends every policy turn), ``<turn>`` 2 (ends every prompt and tool segment),
``<nl>`` is not special (a newline is byte 10). There is no ``<unk>`` (``unk_id == -1``): every text encodes and
decodes back to itself. Standard library only.
"""

from __future__ import annotations

from typing import Iterable

from .tokens import OWNER_POLICY, register_tokenizer_format

BYTE_FORMAT = "bugfix_gym.ByteTokenizer/1"
PAD_ID, EOC_ID, TURN_ID = 0, 1, 2
N_SPECIALS = 3
"""Byte ``b`` is id ``b + N_SPECIALS``."""


class ByteTokenizer:
    """UTF-8 bytes <-> ids (:class:`bugfix_gym.contract.tokens.TokenizerLike`); 259 ids.

    ``decode`` turns bytes that are not valid UTF-8 (a policy's ids cut inside a character) into U+FFFD, so any
    ids decode to some text, which the env then reads as the call it is (an invalid one, usually).
    """

    pad_id = PAD_ID
    eoc_id = EOC_ID
    turn_id = TURN_ID
    unk_id = -1

    @property
    def vocab_size(self) -> int:
        return 256 + N_SPECIALS

    def encode(self, text: str) -> list[int]:
        """Text -> one id per UTF-8 byte (no specials)."""
        return [b + N_SPECIALS for b in text.encode("utf-8")]

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str:
        """Ids -> text, up to ``<eoc>`` (with ``stop_at_eoc``); specials and ids out of range are dropped."""
        out = bytearray()
        for i in ids:
            i = int(i)
            if stop_at_eoc and i == EOC_ID:
                break
            if N_SPECIALS <= i < 256 + N_SPECIALS:
                out.append(i - N_SPECIALS)
        return out.decode("utf-8", errors="replace")

    def segment_ids(self, owner: int, text: str) -> list[int]:
        """One transcript segment: a call (owner 2) ends with ``<eoc>``, a prompt or tool output with ``<turn>``."""
        return self.encode(text) + [EOC_ID if owner == OWNER_POLICY else TURN_ID]

    def to_dict(self) -> dict:
        return {"format": BYTE_FORMAT}

    @classmethod
    def from_dict(cls, data: dict) -> "ByteTokenizer":
        if not isinstance(data, dict) or data.get("format") != BYTE_FORMAT:
            raise ValueError(f"not a byte tokenizer (expected format {BYTE_FORMAT!r})")
        return cls()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ByteTokenizer)

    def __hash__(self) -> int:
        return hash(BYTE_FORMAT)


register_tokenizer_format(BYTE_FORMAT, ByteTokenizer.from_dict)
