"""Array views of BugFix-v1: factorised masked heads (``BugFixCalls-v1``) and byte tokens (``BugFixTokens-v1``).

BugFix-v1's action is text (``edit 3.1 op <=``, ``delete 4``, ``patch 2 return x``). Two wrappers turn it into
arrays, as :mod:`bugfix_gym.views.wrappers` does for v0:

* :class:`FactorisedCalls` (``gym.make("BugFixCalls-v1")``): the action is five heads,
  ``MultiDiscrete([9, MAX_LINES, MAX_EXPRS, len(MUTATIONS), len(ARGS)])`` = (kind, line, expr, mutation, arg):

  - ``kind`` indexes ``CALL_KINDS`` (read, test, locate, edit, patch, insert, delete, revert, submit);
  - ``line`` is line ``L = line + 1`` (``edit`` and ``delete`` read it); ``expr`` is the site ``K`` on it,
    ``mutation`` a word of ``MUTATIONS`` and ``arg`` a word of ``ARGS`` (``edit`` reads them; a mutation
    that takes no argument ignores ``arg``);
  - ``patch`` and ``insert`` take free code, which no closed head can write: they are **not expressible**
    here (always masked out; chosen anyway, the call is sent without its code and the env answers it as
    the invalid call it is). Use ``BugFixTokens-v1`` or the text env for them.
  - A head the chosen kind does not read is "don't care": its mask opens index 0 only, so an autoregressive
    policy spends no probability on it.

* :class:`ByteTokenCalls` (``gym.make("BugFixTokens-v1")``): the action is the call's bytes,
  ``MultiDiscrete([259] * max_call_tokens)`` ids of :class:`~bugfix_gym.contract.byte_tokenizer.ByteTokenizer`,
  decoded up to the first ``<eoc>`` / ``<pad>``: every call, ``patch`` and ``insert`` included, is writable,
  and no identifier of a real function is ever unknown.

Observation (both): the episode so far as byte ids, owner codes and an attention mask (``ids``, ``owner``,
``attention_mask``, each ``[max_len]``), kept as the v0 views keep theirs (:class:`TokenView`: the prompt is
kept first, the oldest turns after it drop out when it overflows).

Masks (:class:`FactorisedCalls`). The legal set is what the env's ``legal_calls()`` lists minus ``patch`` /
``insert``: an ``edit`` the edits engine's ``legal_edits`` holds on the current source, a ``delete L`` of a
deletable line, and the other kinds where the env's ``info["call_mask"]`` opens them.

* :meth:`FactorisedCalls.head_masks` ``(prefix)``: the exact mask of the next head given the choices so far
  (``()`` -> kind, ``(kind,)`` -> line, ... ``(kind, line, expr, mutation)`` -> arg). A policy that samples
  the heads in order under these masks only ever plays legal calls.
* :meth:`FactorisedCalls.action_masks` (sb3-contrib ``MaskablePPO``, which samples the heads of a
  ``MultiDiscrete`` independently): the five heads' masks concatenated, each the *projection* of the legal
  set on that head (index ``i`` is open iff some legal call has it). Every open index belongs to a legal call,
  but independent heads over-approximate: ``line`` of one edit with ``mutation`` of another can be illegal.
  Such an action is played as the env plays any illegal call (an invalid turn that changes nothing);
  ``info["legal_action"]`` says whether the last one was legal. Only an autoregressive policy over
  :meth:`head_masks` avoids them.

The same flat mask is in the observation under the key each library reads (``layout``, as ``BugFixCalls-v0``):
``"dict"`` adds ``action_mask`` (SB3, sb3-contrib, TorchRL), ``"tianshou"`` is ``{"obs", "mask"}``, ``"rllib"``
is ``{"observations", "action_mask"}``; ``info`` holds the five per-head masks as ``kind_head_mask``, ...,
``arg_head_mask``.

Info (both views): :data:`V1_VIEW_INFO_KEYS`, numbers of fixed shape only (vector envs and replay buffers stack
them); the text env's own ``info`` and transcript stay on ``env.unwrapped``.
"""

from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..contract.byte_tokenizer import ByteTokenizer
from ..contract.tokens import OWNER_POLICY, TokenizerLike, encode_segment
from ..core.calls_v1 import CALL_KINDS
from ..edits.patches import deletable_lines
from ..edits.sites import ARG_INDEX, ARGS, MAX_EXPRS, MAX_LINES, MUTATION_INDEX, MUTATIONS, EditError, legal_edits
from .wrappers import _TokenViewWrapper, call_ids

HEADS: tuple[str, ...] = ("kind", "line", "expr", "mutation", "arg")
"""The heads of :class:`FactorisedCalls`, in the order an autoregressive policy picks them."""
HEAD_SIZES: tuple[int, ...] = (len(CALL_KINDS), MAX_LINES, MAX_EXPRS, len(MUTATIONS), len(ARGS))
KIND_INDEX: Mapping[str, int] = {kind: i for i, kind in enumerate(CALL_KINDS)}
FREE_TEXT_KINDS: tuple[str, ...] = ("patch", "insert")
"""The kinds no closed head can write (their code is free text): always masked out in :class:`FactorisedCalls`."""
V1_VIEW_INFO_KEYS: tuple[str, ...] = ("task_index", "turn", "n_invalid", "valid", "submitted", "hidden_pass",
                                      "stop_code", "call_mask", "edit_line_mask", "n_dropped_tokens")
"""The ``info`` keys of both v1 views (:class:`FactorisedCalls` adds ``legal_action`` and the head masks)."""
V1_STOP_REASONS: tuple[str, ...] = ("", "submit", "budget")
"""``V1_STOP_REASONS[info["stop_code"]]`` is the text env's ``info["stop"]`` (``""`` for ``None``; -1 for another)."""

Layout = Literal["dict", "tianshou", "rllib"]
LAYOUTS: tuple[str, ...] = ("dict", "tianshou", "rllib")


def _open_first(size: int) -> np.ndarray:
    """The "don't care" mask of a head the chosen kind does not read: index 0 only."""
    mask = np.zeros(size, dtype=bool)
    mask[0] = True
    return mask


class LegalHeads:
    """The legal calls of one state as heads: exact next-head masks, per-head projections, and decoding.

    :param source: the current source (a source that does not parse has no legal edit or delete)
    :param call_mask: the text env's ``info["call_mask"]`` (bool over ``CALL_KINDS``)
    """

    def __init__(self, source: str, call_mask: Sequence[bool] | np.ndarray):
        try:
            self.edits = legal_edits(source)
            self.deletable = tuple(line for line in deletable_lines(source) if line <= MAX_LINES)
        except EditError:
            self.edits, self.deletable = {}, ()
        self.edit_lines = tuple(sorted({line for (line, _) in self.edits if line <= MAX_LINES}))
        kinds = np.array(call_mask, dtype=bool).copy()
        for kind in FREE_TEXT_KINDS:
            kinds[KIND_INDEX[kind]] = False
        kinds[KIND_INDEX["edit"]] &= bool(self.edit_lines)
        kinds[KIND_INDEX["delete"]] &= bool(self.deletable)
        self.kinds = kinds
        self._projections: list[np.ndarray] | None = None

    def next_mask(self, prefix: Sequence[int]) -> np.ndarray:
        """The mask of head ``len(prefix)`` given the choices ``prefix`` of the heads before it.

        A prefix that is itself illegal leaves nothing legal: the mask is all False.

        :param prefix: indices of the first 0 to 4 heads
        """
        depth = len(prefix)
        if not 0 <= depth < len(HEADS):
            raise ValueError(f"a prefix holds 0 to {len(HEADS) - 1} head indices, got {len(prefix)}")
        if depth == 0:
            return self.kinds.copy()
        size = HEAD_SIZES[depth]
        mask = np.zeros(size, dtype=bool)
        kind = int(prefix[0])
        if not (0 <= kind < len(CALL_KINDS) and self.kinds[kind]):
            return mask
        name = CALL_KINDS[kind]
        if name == "delete":
            if depth == 1:
                mask[[line - 1 for line in self.deletable]] = True
                return mask
            return _open_first(size) if int(prefix[1]) + 1 in self.deletable else mask
        if name != "edit":
            return _open_first(size)
        return self._edit_mask([int(i) for i in prefix[1:]], size)

    def _edit_mask(self, chosen: list[int], size: int) -> np.ndarray:
        """The next head of an ``edit`` given its line (, expr (, mutation)) indices."""
        mask = np.zeros(size, dtype=bool)
        if not chosen:
            mask[[line - 1 for line in self.edit_lines]] = True
            return mask
        line = chosen[0] + 1
        if len(chosen) == 1:
            mask[[k for (at, k) in self.edits if at == line]] = True
            return mask
        site = self.edits.get((line, chosen[1]), {})
        if len(chosen) == 2:
            mask[[MUTATION_INDEX[m] for m in site]] = True
            return mask
        args = site.get(MUTATIONS[chosen[2]], ()) if 0 <= chosen[2] < len(MUTATIONS) else ()
        if args == (None,):
            return _open_first(size)
        mask[[ARG_INDEX[a] for a in args if a is not None]] = True
        return mask

    def projections(self) -> list[np.ndarray]:
        """Each head's projection of the legal set: index ``i`` open iff some legal call has it (the
        "don't care" index 0 of a head is open when some legal call does not read that head). Fresh arrays."""
        if self._projections is None:
            self._projections = self._project()
        return [mask.copy() for mask in self._projections]

    def _project(self) -> list[np.ndarray]:
        masks = [self.kinds.copy()] + [np.zeros(size, dtype=bool) for size in HEAD_SIZES[1:]]
        delete = bool(self.kinds[KIND_INDEX["delete"]])
        plain = any(self.kinds[KIND_INDEX[k]] for k in CALL_KINDS if k not in ("edit", "delete"))
        for head in range(1, len(HEADS)):
            masks[head][0] |= plain or (head > 1 and delete)
        if delete:
            masks[1][[line - 1 for line in self.deletable]] = True
        if self.kinds[KIND_INDEX["edit"]]:
            sites = [(line, k, site) for (line, k), site in self.edits.items() if line <= MAX_LINES]
            masks[1][[line - 1 for line, _, _ in sites]] = True
            masks[2][[k for _, k, _ in sites]] = True
            mutations = {m for _, _, site in sites for m in site}
            masks[3][[MUTATION_INDEX[m] for m in mutations]] = True
            args = {a for _, _, site in sites for values in site.values() for a in values}
            masks[4][[ARG_INDEX[a] if a is not None else 0 for a in args]] = True
        return masks

    def is_legal(self, action: Sequence[int]) -> bool:
        """Whether the five indices play a legal call (the heads its kind does not read may hold anything)."""
        kind, line, expr, mutation, arg = (int(i) for i in action)
        if not self.kinds[kind]:
            return False
        name = CALL_KINDS[kind]
        if name == "delete":
            return line + 1 in self.deletable
        if name != "edit":
            return True
        args = self.edits.get((line + 1, expr), {}).get(MUTATIONS[mutation], ())
        return args == (None,) or ARGS[arg] in args

    def call(self, action: Sequence[int]) -> str:
        """The call text of five head indices (legal or not: an illegal one reads as the illegal call it is)."""
        kind, line, expr, mutation, arg = (int(i) for i in action)
        name = CALL_KINDS[kind]
        if name == "delete":
            return f"delete {line + 1}"
        if name != "edit":
            return name
        word = MUTATIONS[mutation]
        args = self.edits.get((line + 1, expr), {}).get(word, ())
        head = f"edit {line + 1}.{expr} {word}"
        return head if args == (None,) else f"{head} {ARGS[arg]}"


class _V1TokenWrapper(_TokenViewWrapper):
    """Common part of the two v1 views: a byte :class:`TokenView` of the wrapped BugFix-v1 text env (reset and
    the text step are the v0 views')."""

    _WRAPS = "the v1 array views wrap the text env (BugFix-v1)"
    _ONE_OF = "FactorisedCalls / ByteTokenCalls"

    @staticmethod
    def _default_tokenizer(env: gym.Env) -> TokenizerLike:
        return ByteTokenizer()

    @staticmethod
    def _task_key(task: Any) -> Any:
        return id(task)

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        """The text env's ``info`` as numbers of fixed shape (:data:`V1_VIEW_INFO_KEYS`)."""
        stop = info.get("stop") or ""
        return {
            "task_index": self._task_index.get(self._task_key(getattr(self.env.unwrapped, "task", None)), -1),
            "turn": int(info["turn"]),
            "n_invalid": int(info["n_invalid"]),
            "valid": bool(info["valid"]),
            "submitted": bool(info["submitted"]),
            "hidden_pass": bool(info["hidden_pass"]),
            "stop_code": V1_STOP_REASONS.index(stop) if stop in V1_STOP_REASONS else -1,
            "call_mask": np.array(info["call_mask"], dtype=bool),
            "edit_line_mask": np.array(info["line_mask"], dtype=bool),
            "n_dropped_tokens": self.view.n_dropped,
        }


class FactorisedCalls(_V1TokenWrapper):
    """BugFix-v1 with five factorised, masked action heads (kind, line, expr, mutation, arg).

    ## Action Space
    ``MultiDiscrete([9, MAX_LINES, MAX_EXPRS, len(MUTATIONS), len(ARGS)])``: see :mod:`bugfix_gym.views.heads_v1`
    (``patch`` / ``insert`` are not expressible; ``delete`` reads the line head).

    ## Observation Space
    The byte token view (``ids``, ``owner``, ``attention_mask``) and the flat mask (:meth:`action_masks`) under
    the keys of ``layout``.

    ## Info
    :data:`V1_VIEW_INFO_KEYS`, ``legal_action`` (whether the last action was a legal call; True after reset) and
    the per-head projections ``kind_head_mask`` ... ``arg_head_mask``.

    :param env: a BugFix-v1 text env
    :param tokenizer: the observation's tokenizer (default :class:`ByteTokenizer`)
    :param max_len: padded observation length
    :param layout: ``"dict"``, ``"tianshou"`` or ``"rllib"``
    """

    def __init__(self, env: gym.Env, tokenizer: TokenizerLike | None = None, max_len: int = 2048,
                 layout: Layout = "dict"):
        gym.utils.RecordConstructorArgs.__init__(self, tokenizer=tokenizer, max_len=max_len, layout=layout)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        super().__init__(env, tokenizer, max_len)
        self.layout = layout
        self.action_space = spaces.MultiDiscrete(list(HEAD_SIZES))
        flat = spaces.Box(0, 1, shape=(sum(HEAD_SIZES),), dtype=np.bool_)  # type: ignore[arg-type]
        self.observation_space = self._masked_space(layout, flat)
        self.legal = LegalHeads("", np.zeros(len(CALL_KINDS), dtype=bool))
        self._legal_cache: dict[tuple[str, bytes], LegalHeads] = {}  # a state's masks, by source and call mask
        self._legal_action = True

    def _refresh(self, info: dict[str, Any]) -> None:
        source: str = self.env.unwrapped.source  # type: ignore[attr-defined]
        key = (source, np.asarray(info["call_mask"], dtype=bool).tobytes())
        legal = self._legal_cache.get(key)
        if legal is None:
            if len(self._legal_cache) >= 256:
                self._legal_cache.clear()
            legal = self._legal_cache[key] = LegalHeads(source, info["call_mask"])
        self.legal = legal

    def _observe(self, info: dict[str, Any]) -> dict[str, np.ndarray]:
        self._refresh(info)
        flat = self.action_masks()
        arrays = self.view.arrays()
        if self.layout == "dict":
            arrays["action_mask"] = flat
            return arrays
        tokens = np.concatenate([arrays["ids"], arrays["owner"]]).astype(np.float32)  # [2 * max_len]
        if self.layout == "tianshou":
            return {"obs": tokens, "mask": flat}
        return {"observations": tokens, "action_mask": flat}

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        out = super()._info(info)
        out["legal_action"] = self._legal_action
        for head, mask in zip(HEADS, self.legal.projections()):
            out[f"{head}_head_mask"] = mask
        return out

    def action_masks(self) -> np.ndarray:
        """bool[sum(HEAD_SIZES)]: the five heads' projections concatenated (sb3-contrib's ``MultiDiscrete``
        convention). Independent heads over-approximate the legal set: see the module docstring."""
        return np.concatenate(self.legal.projections())

    def head_masks(self, prefix: Sequence[int] = ()) -> np.ndarray:
        """The exact mask of the next head given the heads chosen so far (``()`` -> kind, ``(kind,)`` -> line,
        ..., ``(kind, line, expr, mutation)`` -> arg): sampling the heads in order under it gives a legal call.

        :param prefix: the indices of the heads chosen so far (0 to 4 of them)
        """
        return self.legal.next_mask(prefix)

    def sample_legal(self, rng: np.random.Generator) -> np.ndarray:
        """A uniformly drawn head at a time under :meth:`head_masks`: always a legal call (a random legal policy).

        :param rng: where the draws come from
        """
        chosen: list[int] = []
        for _ in HEADS:
            chosen.append(int(rng.choice(np.flatnonzero(self.head_masks(chosen)))))
        return np.array(chosen, dtype=np.int64)

    def call_text(self, action: Sequence[int]) -> str:
        """The call text an action plays (``[3, 2, 1, 0, 80]`` -> ``edit 3.1 op <=``)."""
        return self.legal.call(self._indices(action))

    def _indices(self, action: Any) -> list[int]:
        arr = np.asarray(action)
        if arr.shape != (len(HEADS),) or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"FactorisedCalls actions are {len(HEADS)} integer head indices (kind, line, expr, "
                            f"mutation, arg), got {action!r:.80}")
        if (arr < 0).any() or (arr >= np.array(HEAD_SIZES)).any():
            raise ValueError(f"head indices must be below {list(HEAD_SIZES)}, got {arr.tolist()}")
        return [int(i) for i in arr]

    def step(self, action):
        indices = self._indices(action)
        self._legal_action = self.legal.is_legal(indices)
        call = self.legal.call(indices)
        return self._step_text(call, encode_segment(self.tokenizer, OWNER_POLICY, call))

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        self._legal_action = True
        return super().reset(seed=seed, options=options)


class ByteTokenCalls(_V1TokenWrapper):
    """BugFix-v1 with byte-token actions and the byte token observation.

    ## Action Space
    ``MultiDiscrete([259] * max_call_tokens)``: the call's UTF-8 bytes as :class:`ByteTokenizer` ids; ids after the
    first ``<eoc>`` / ``<pad>`` are ignored. Every call the text env reads is writable (``patch 3 return x`` too)
    within ``max_call_tokens`` bytes.

    ## Observation Space
    ``Dict(ids, owner, attention_mask)``, each ``[max_len]``: see :mod:`bugfix_gym.views.heads_v1`.

    :param env: a BugFix-v1 text env
    :param tokenizer: default :class:`ByteTokenizer` (any ``TokenizerLike`` works; the byte one never says unknown)
    :param max_len: padded observation length
    :param max_call_tokens: ids per action
    """

    def __init__(self, env: gym.Env, tokenizer: TokenizerLike | None = None, max_len: int = 2048,
                 max_call_tokens: int = 64):
        gym.utils.RecordConstructorArgs.__init__(self, tokenizer=tokenizer, max_len=max_len,
                                                 max_call_tokens=max_call_tokens)
        super().__init__(env, tokenizer, max_len)
        self._token_actions(max_call_tokens)

    def policy_ids(self, action: Any) -> list[int]:
        """The ids of ``action`` the view records: up to and including the first ``<eoc>`` / ``<pad>``."""
        return call_ids(action, self.tokenizer, self.max_call_tokens, "ByteTokenCalls")

    def encode_call(self, call: str) -> np.ndarray:
        """A call's text as one action (its ids, ``<eoc>``, padding); ValueError if it is longer than the action."""
        ids = encode_segment(self.tokenizer, OWNER_POLICY, call)
        if len(ids) > self.max_call_tokens:
            raise ValueError(f"the call takes {len(ids)} ids with its <eoc>; this view writes {self.max_call_tokens} "
                             "(raise max_call_tokens)")
        return np.array(ids + [self.tokenizer.pad_id] * (self.max_call_tokens - len(ids)), dtype=np.int64)

    def step(self, action):
        ids = self.policy_ids(action)
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == self.tokenizer.pad_id else ids)
        return self._step_text(text, ids)


def make_factorised_calls(tokenizer: TokenizerLike | None = None, max_len: int = 2048, layout: Layout = "dict",
                          **env_kwargs: Any) -> FactorisedCalls:
    """``FactorisedCalls(BugFixEnvV1(**env_kwargs), ...)``: the entry point of ``BugFixCalls-v1``."""
    from ..core.env_v1 import BugFixEnvV1

    return FactorisedCalls(BugFixEnvV1(**env_kwargs), tokenizer, max_len, layout)


def make_byte_token_calls(tokenizer: TokenizerLike | None = None, max_len: int = 2048, max_call_tokens: int = 64,
                          **env_kwargs: Any) -> ByteTokenCalls:
    """``ByteTokenCalls(BugFixEnvV1(**env_kwargs), ...)``: the entry point of ``BugFixTokens-v1``."""
    from ..core.env_v1 import BugFixEnvV1

    return ByteTokenCalls(BugFixEnvV1(**env_kwargs), tokenizer, max_len, max_call_tokens)
