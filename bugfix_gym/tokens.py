"""The token view of an episode: ids, owner codes and the policy mask.

Owner codes say who produced each token — prompt 1, policy 2, tool 3, pad 0 — and come
from the episode's transcript segments, never from the token ids. They are defined here, the
lowest module that needs them (``bugfix_gym.env`` and the wrappers import them from here).
:func:`policy_mask` is ``owner == 2`` aligned with the targets ``ids[1:]``: only the tokens the
policy wrote (each call followed by ``<eoc>``) get a policy gradient. It is not an action mask:
``action_mask`` only names the key under which the array views hand the nine-call mask
(``info["call_mask"]``) to RLlib and TorchRL.

Turn format: every prompt and tool segment ends with ``<turn>`` (owned by that segment: prompt
1 / tool 3), so the policy's turn always starts right after ``<turn>``. No tool output can then
end in something that reads like a call (``... nothing to revert``, the ``... | submit`` menu).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .tokenizer import Tokenizer

OWNER_PAD, OWNER_PROMPT, OWNER_POLICY, OWNER_TOOL = 0, 1, 2, 3


def encode_segment(tokenizer: Tokenizer, owner: int, text: str) -> list[int]:
    """One transcript segment -> ids: a policy segment (a call) ends with ``<eoc>``, a prompt or
    tool segment with ``<turn>`` (the policy writes next)."""
    ids = tokenizer.encode(text)
    ids.append(tokenizer.eoc_id if owner == OWNER_POLICY else tokenizer.turn_id)
    return ids


def episode_tokens(transcript: Sequence[tuple[int, str]], tokenizer: Tokenizer) -> tuple[np.ndarray, np.ndarray]:
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
