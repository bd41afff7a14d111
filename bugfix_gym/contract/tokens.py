"""The token view of an episode: ids, owner codes and the policy mask.

Owner codes say who produced each token — prompt 1, policy 2, tool 3, pad 0 — and come
from the episode's transcript segments, never from the token ids. They are defined here, the
lowest module that needs them (``bugfix_gym.core.env`` and the wrappers import them from here).
:func:`policy_mask` is ``owner == 2`` aligned with the targets ``ids[1:]``: only the tokens the
policy wrote (each call followed by ``<eoc>``) get a policy gradient. It is not an action mask:
``action_mask`` only names the key under which the array views hand the nine-call mask
(``info["call_mask"]``) to RLlib and TorchRL.

Turn format: every prompt and tool segment ends with ``<turn>`` (owned by that segment: prompt
1 / tool 3), so the policy's turn always starts right after ``<turn>``. No tool output can then
end in something that reads like a call (``... nothing to revert``, the ``... | submit`` menu).

Any tokenizer that has what :class:`TokenizerLike` lists stands where :class:`bugfix_gym.Tokenizer` stands
(the token views, the agents' sampler, grammar and policy): the segment rule lives in the tokenizer's
``segment_ids``, so a chat-template tokenizer
(:class:`bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`) renders its own turn markers
and nothing here special-cases it.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, Sequence, runtime_checkable

import numpy as np

from .tokenizer import FORMAT, Tokenizer

OWNER_PAD, OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL = 0, 1, 2, 3


@runtime_checkable
class TokenizerLike(Protocol):
    """What the token views and the agents need from a tokenizer.

    ``eoc_id`` ends every policy turn (``<eoc>``; a chat template's end-of-turn id), ``pad_id`` pads,
    ``unk_id`` marks an unknown word (-1 when the tokenizer has none). ``encode`` is plain text -> ids
    (no specials; the legal calls' trie is built from it), ``decode`` is ids -> text up to ``eoc_id``
    (the text the env receives), ``segment_ids(owner, text)`` the ids of one transcript segment
    (:func:`encode_segment`), and ``to_dict`` what a saved policy keeps (:func:`tokenizer_from_dict`
    reads it back).
    """

    pad_id: int
    unk_id: int
    eoc_id: int

    @property
    def vocab_size(self) -> int: ...

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str: ...

    def segment_ids(self, owner: int, text: str) -> list[int]: ...

    def to_dict(self) -> dict: ...


def encode_segment(tokenizer: TokenizerLike, owner: int, text: str) -> list[int]:
    """One transcript segment -> ids, by the tokenizer's own rule (``tokenizer.segment_ids``).

    :class:`bugfix_gym.Tokenizer`: a policy segment (a call) ends with ``<eoc>``, a prompt or tool
    segment with ``<turn>`` (the policy writes next). A chat-template tokenizer: the template's
    rendering of the prompt, the call's ids and the end-of-turn id, the template's tool suffix.
    """
    return tokenizer.segment_ids(owner, text)


TOKENIZER_FORMATS: dict[str, Callable[[dict], TokenizerLike]] = {}
"""``to_dict()["format"]`` -> the function that reads such a dict back. Each tokenizer kind registers its own
format (:func:`register_tokenizer_format`), so this module names none but its own."""


def register_tokenizer_format(name: str, from_dict: Callable[[dict], TokenizerLike]) -> None:
    """Let :func:`tokenizer_from_dict` read tokenizers saved with ``to_dict()["format"] == name``.

    :param name: the format string the tokenizer's ``to_dict`` writes
    :param from_dict: reads that dict back into a tokenizer
    """
    TOKENIZER_FORMATS[name] = from_dict


def tokenizer_from_dict(data: Any) -> TokenizerLike:
    """A tokenizer from its ``to_dict()``, by its registered format (:data:`TOKENIZER_FORMATS`).

    :param data: what ``to_dict()`` returned
    """
    kind = data.get("format") if isinstance(data, dict) else None
    reader = TOKENIZER_FORMATS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        if kind in (None, "bugfix_gym.Tokenizer/1"):  # ours, unmarked or too old: it says what is wrong
            return Tokenizer.from_dict(data)
        known = ", ".join(map(repr, sorted(TOKENIZER_FORMATS)))
        raise ValueError(f"unknown tokenizer format {kind!r:.60}; expected one of {known}")
    return reader(data)


register_tokenizer_format(FORMAT, Tokenizer.from_dict)


def episode_tokens(transcript: Sequence[tuple[int, str]], tokenizer: TokenizerLike) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, text)`` segments -> ``ids`` int64 [T], ``owner`` int8 [T]."""
    ids: list[int] = []
    owner: list[int] = []
    for code, text in transcript:
        if code not in (OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL):
            raise ValueError(f"unknown owner code {code}; use 1 (prompt), 2 (policy) or 3 (tool)")
        seg = encode_segment(tokenizer, code, text)
        ids += seg
        owner += [code] * len(seg)
    return np.asarray(ids, dtype=np.int64), np.asarray(owner, dtype=np.int8)


def policy_mask(owner: np.ndarray) -> np.ndarray:
    """``[T-1]`` float 0/1, aligned with the targets ``ids[1:]``: 1 where the policy wrote ``ids[t+1]``.

    The token-level mask that decides which positions get a policy gradient (the nine-call mask
    of the array views is a different thing, ``info["call_mask"]``).
    """
    return (np.asarray(owner)[1:] == OWNER_POLICY).astype(np.float32)
