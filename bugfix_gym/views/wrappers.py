"""Numeric views of BugFix-v0 for libraries that need array spaces (SB3, TorchRL, Tianshou, RLlib, ...).

The text env itself runs in SB3's vector envs (its spaces are ``BufferedText``), but most
libraries' policies want arrays, so two wrappers turn the text episode into arrays:

* :class:`TokenObservation` - the agent writes *tokens*: actions are
  ``MultiDiscrete([vocab_size] * max_call_tokens)`` token ids, decoded up to the first
  ``<eoc>`` (or ``<pad>``) into the call text. Observations are the whole episode so far
  as token ids with owner codes and an attention mask.
* :class:`DiscreteCalls` - the agent picks one of the nine legal calls:
  ``Discrete(9)`` over :data:`bugfix_gym.CALLS`, the same token observation plus a bool
  call mask under the key each library reads (``layout=``), and an ``action_masks()``
  method (sb3-contrib ``MaskablePPO`` convention).

Both are registered: ``gym.make("BugFixCalls-v0", max_len=128, layout="tianshou",
split="train")`` and ``gym.make("BugFixTokens-v0", max_len=128)`` build the view over a
fresh ``BugFix-v0`` (view arguments first, the rest go to the env), so a library that
takes an env id needs no glue.

Observation (both views), ``Dict`` of ``Box`` arrays of length ``max_len``:

* ``ids`` int64: token ids, left-aligned, right-padded with ``tokenizer.pad_id`` (0);
* ``owner`` int8: who produced each token - 1 prompt, 2 policy, 3 tool, 0 pad;
* ``attention_mask`` int8: 1 on real tokens, 0 on padding (``owner != 0``).

Every segment is encoded with :func:`bugfix_gym.encode_segment` (the prompt as owner 1, each
tool output as owner 3), so the view holds exactly the ids of
:func:`bugfix_gym.episode_tokens`, turn markers included. Owner codes come from who
produced each token, never from the ids: the policy segment of a turn is exactly the ids
the agent gave (up to and including its ``<eoc>``) for :class:`TokenObservation`, and
``encode_segment(tokenizer, 2, call)`` for :class:`DiscreteCalls`; the token-level policy
mask of a trainer is ``owner == 2`` (:func:`bugfix_gym.contract.tokens.policy_mask`).

``tokenizer=`` takes any :class:`bugfix_gym.contract.tokens.TokenizerLike`: a Hugging Face tokenizer with a chat
template through :class:`bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer` (its end-of-turn
id plays ``<eoc>``'s role, its segments are the template's; docs/hf_tokenizers.md).

Info (both views): fixed keys and shapes, numbers only (no ``None``, no strings, nothing
that grows), so that replay buffers (Tianshou), TorchRL's info reader and vector envs can
stack it: :data:`VIEW_INFO_KEYS`. The text env's growing lists become counts and the
latest entry (``n_edits``; ``last_call``, an index into ``CALLS``, -1 before the first
call and after an invalid one); its strings become indices (``task_index`` into
``env.unwrapped.tasks``, -1 for a task given by ``reset(options=...)`` from outside it;
``stop_code`` into :data:`STOP_REASONS`). TorchRL's vector ``GymEnv`` cannot carry string
infos, which is why these are numbers. The full history stays on ``env.unwrapped``
(``actions``, ``ops``, ``transcript``, ``task``).

Longer than ``max_len``: the prompt (at most ``max_len // 2`` tokens of it) is kept and the
oldest tokens after it are dropped, so the policy always sees the task and the latest
turns; ``info["n_dropped_tokens"]`` says how many were dropped (0 in a normal book-sized
episode with the default ``max_len=512``).
"""

from __future__ import annotations

from typing import Any, Literal, Sequence

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from ..tasks.library import make_tasks
from .text_wrappers import make_bugfix_env
from ..core.vocabulary import Tokenizer, build_tokenizer, fixed_tokenizer
from ..contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, TokenizerLike, encode_segment
from ..core.tools import CALL_INDEX, CALLS

_DEFAULT_TOKENIZER: Tokenizer | None = None
_FIXED_TOKENIZER: Tokenizer | None = None

VIEW_INFO_KEYS = ("task_index", "turn", "n_turns", "n_edits", "n_invalid", "valid", "submitted", "hidden_pass",
                  "stop_code", "last_call", "call_mask", "useful_calls", "n_dropped_tokens")
"""The ``info`` keys of both views: ints, bools, ``call_mask`` and ``useful_calls`` (bool[9]); see the module
docstring."""
STOP_REASONS: tuple[str, ...] = ("", "submit", "budget")
"""``STOP_REASONS[info["stop_code"]]`` is the text env's ``info["stop"]`` (``""`` for ``None``)."""

Layout = Literal["dict", "tianshou", "rllib"]
LAYOUTS: tuple[str, ...] = ("dict", "tianshou", "rllib")


def default_tokenizer(env: gym.Env) -> Tokenizer:
    """The book tokenizer (``build_tokenizer()``) for the book's tasks; for an env with any other
    task (generated, a task pack), the fixed vocabulary :func:`bugfix_gym.core.vocabulary.fixed_tokenizer`,
    in which unseen function names and words are ``<unk>``.

    Pass one tokenizer explicitly to every env of a vectorised set whose tasks differ, so
    they share ids.
    """
    global _DEFAULT_TOKENIZER, _FIXED_TOKENIZER
    unwrapped = env.unwrapped
    book = {t.uid for t in make_tasks("all")}
    if getattr(unwrapped, "generated", None) or any(t.uid not in book for t in getattr(unwrapped, "tasks", [])):
        if _FIXED_TOKENIZER is None:
            _FIXED_TOKENIZER = fixed_tokenizer()
        return _FIXED_TOKENIZER
    if _DEFAULT_TOKENIZER is None:
        _DEFAULT_TOKENIZER = build_tokenizer()
    return _DEFAULT_TOKENIZER


class TokenView:
    """The episode so far as token ids and owner codes, grown one segment at a time.

    Shared by both wrappers: ``reset(prompt_ids)``, then ``add(owner, ids)`` for each policy
    and tool segment, and ``arrays()`` for fresh, padded observation arrays.

    :param tokenizer: gives ``pad_id`` and the vocabulary size
    :param max_len: length of the padded arrays
    """

    def __init__(self, tokenizer: TokenizerLike, max_len: int):
        if max_len < 2:
            raise ValueError(f"max_len must be at least 2, got {max_len}")
        self.tokenizer = tokenizer
        self.max_len = int(max_len)
        self._ids = np.zeros(2 * self.max_len, dtype=np.int64)  # grows by doubling
        self._owner = np.zeros(2 * self.max_len, dtype=np.int8)
        self.n = 0
        self.n_prompt = 0
        self._encoded: dict[tuple[int, str], np.ndarray] = {}  # tool outputs repeat a lot (sources, test reports)

    def space(self) -> spaces.Dict:
        n, vocab = self.max_len, self.tokenizer.vocab_size
        return spaces.Dict({
            "ids": spaces.Box(0, vocab - 1, shape=(n,), dtype=np.int64),
            "owner": spaces.Box(0, OWNER_TOOL, shape=(n,), dtype=np.int8),
            "attention_mask": spaces.Box(0, 1, shape=(n,), dtype=np.int8),
        })

    def encode(self, owner: int, text: str) -> np.ndarray:
        """``encode_segment(tokenizer, owner, text)`` as an array, memoised (read-only, shared)."""
        key = (owner, text)
        ids = self._encoded.get(key)
        if ids is None:
            if len(self._encoded) >= 4096:
                self._encoded.clear()
            ids = np.asarray(encode_segment(self.tokenizer, owner, text), dtype=np.int64)
            ids.flags.writeable = False
            self._encoded[key] = ids
        return ids

    @property
    def ids(self) -> np.ndarray:
        """The whole episode's ids so far (a copy, not truncated to ``max_len``)."""
        return self._ids[: self.n].copy()

    @property
    def owner(self) -> np.ndarray:
        """The owner code of every token so far (a copy)."""
        return self._owner[: self.n].copy()

    def reset(self, prompt_ids: Sequence[int] | np.ndarray) -> None:
        self.n = 0
        self.add(OWNER_PROMPT, prompt_ids)
        self.n_prompt = self.n

    def add(self, owner: int, ids: Sequence[int] | np.ndarray) -> None:
        k = len(ids)
        if self.n + k > len(self._ids):
            size = max(2 * len(self._ids), self.n + k)
            self._ids = np.resize(self._ids, size)
            self._owner = np.resize(self._owner, size)
        self._ids[self.n: self.n + k] = ids
        self._owner[self.n: self.n + k] = owner
        self.n += k

    @property
    def n_dropped(self) -> int:
        return max(0, self.n - self.max_len)

    def arrays(self) -> dict[str, np.ndarray]:
        """New ``ids`` / ``owner`` / ``attention_mask`` arrays (see the module docstring for overflow)."""
        out_ids = np.full(self.max_len, self.tokenizer.pad_id, dtype=np.int64)
        out_owner = np.zeros(self.max_len, dtype=np.int8)
        if self.n <= self.max_len:
            out_ids[: self.n] = self._ids[: self.n]
            out_owner[: self.n] = self._owner[: self.n]
        else:  # keep (at most half a window of) the prompt, then the latest tokens
            head = min(self.n_prompt, self.max_len // 2)
            tail = self.max_len - head
            out_ids[:head], out_owner[:head] = self._ids[:head], self._owner[:head]
            out_ids[head:] = self._ids[self.n - tail: self.n]
            out_owner[head:] = self._owner[self.n - tail: self.n]
        return {"ids": out_ids, "owner": out_owner, "attention_mask": (out_owner != 0).astype(np.int8)}


def call_ids(action: Any, tokenizer: TokenizerLike, max_call_tokens: int, view: str) -> list[int]:
    """The ids of a token-id action that a view records: up to and including the first ``<eoc>`` / ``<pad>``.

    :raises TypeError: the action is not a 1-d integer array (``view`` names the view in the message)
    :raises ValueError: an id outside the vocabulary
    """
    arr = np.asarray(action)
    if not np.issubdtype(arr.dtype, np.integer) or arr.ndim != 1 or arr.size == 0:
        raise TypeError(f"{view} actions are 1-d integer arrays of up to {max_call_tokens} token ids, "
                        f"got {action!r:.80}")
    if arr.min() < 0 or arr.max() >= tokenizer.vocab_size:
        raise ValueError(f"token ids must be in 0..{tokenizer.vocab_size - 1}, got {arr.tolist()!r:.80}")
    ids = arr[:max_call_tokens].tolist()
    stops = (tokenizer.eoc_id, tokenizer.pad_id)
    for k, i in enumerate(ids):
        if i in stops:
            return ids[: k + 1]
    return ids


class _TokenViewWrapper(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Common part of the two views: keeps a :class:`TokenView` of the wrapped text env (BugFix-v1's views,
    :mod:`bugfix_gym.views.heads_v1`, are built on it too)."""

    _WRAPS = "bugfix_gym wrappers wrap the text env (BugFix-v0)"
    _ONE_OF = "TokenObservation / DiscreteCalls"

    def __init__(self, env: gym.Env, tokenizer: TokenizerLike | None, max_len: int):
        gym.Wrapper.__init__(self, env)
        if not isinstance(env.observation_space, spaces.Text):
            raise TypeError(f"{self._WRAPS}, got observation space {env.observation_space}; apply only one of "
                            f"{self._ONE_OF}")
        self.tokenizer = tokenizer if tokenizer is not None else self._default_tokenizer(env)
        self.view = TokenView(self.tokenizer, max_len)
        self._task_index: dict[Any, int] = {}
        for k, task in enumerate(getattr(env.unwrapped, "tasks", None) or ()):
            self._task_index.setdefault(self._task_key(task), k)

    def _masked_space(self, layout: str, mask_space: spaces.Box) -> spaces.Dict:
        """The observation space of an array view with an action mask, in ``layout``: the view's arrays and
        ``action_mask`` (``"dict"``), or the tokens and owners as one float vector beside the mask under
        Tianshou's (``obs``, ``mask``) or RLlib's (``observations``, ``action_mask``) keys."""
        if layout == "dict":
            space = self.view.space()
            space.spaces["action_mask"] = mask_space
            return space
        n, vocab = self.view.max_len, self.tokenizer.vocab_size
        high = np.concatenate([np.full(n, vocab - 1), np.full(n, OWNER_TOOL)]).astype(np.float32)
        tokens = spaces.Box(np.zeros(2 * n, dtype=np.float32), high, dtype=np.float32)
        obs_key, mask_key = ("obs", "mask") if layout == "tianshou" else ("observations", "action_mask")
        return spaces.Dict({obs_key: tokens, mask_key: mask_space})

    def _token_actions(self, max_call_tokens: int) -> None:
        """Token-id actions of ``max_call_tokens`` ids and the view's arrays as the observation (the token views)."""
        if max_call_tokens < 1:
            raise ValueError(f"max_call_tokens must be at least 1, got {max_call_tokens}")
        self.max_call_tokens = int(max_call_tokens)
        self.action_space = spaces.MultiDiscrete([self.tokenizer.vocab_size] * self.max_call_tokens)
        self.observation_space = self.view.space()

    @staticmethod
    def _default_tokenizer(env: gym.Env) -> TokenizerLike:
        return default_tokenizer(env)

    @staticmethod
    def _task_key(task: Any) -> Any:
        """What identifies a task of ``env.tasks`` (``info["task_index"]`` is its index)."""
        return task.uid

    def _observe(self, info: dict[str, Any]) -> dict[str, np.ndarray]:
        """Fresh observation arrays; subclasses add keys from the env's ``info``."""
        return self.view.arrays()

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        """The text env's ``info`` as numbers of fixed shape (:data:`VIEW_INFO_KEYS`)."""
        actions = info["actions"]
        last = " ".join(actions[-1].split()) if actions and info["valid"] else ""
        return {
            "task_index": self._task_index.get(self._task_key(self.env.unwrapped.task), -1),  # type: ignore
            "turn": info["turn"],
            "n_turns": info["n_turns"],
            "n_edits": len(info["ops"]),
            "n_invalid": info["n_invalid"],
            "valid": info["valid"],
            "submitted": info["submitted"],
            "hidden_pass": info["hidden_pass"],
            "stop_code": STOP_REASONS.index(info["stop"] or ""),
            "last_call": CALL_INDEX.get(last, -1),
            "call_mask": np.array(info["call_mask"], dtype=bool),
            "useful_calls": np.array(info["useful_calls"], dtype=bool),
            "n_dropped_tokens": self.view.n_dropped,
        }

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        text, info = self.env.reset(seed=seed, options=options)
        self.view.reset(self.view.encode(OWNER_PROMPT, text))
        return self._observe(info), self._info(info)

    def _step_text(self, call_text: str, policy_ids: Sequence[int]):
        """Play ``call_text`` in the text env; record ``policy_ids`` (owner 2) and the tool output (owner 3)."""
        text, reward, terminated, truncated, info = self.env.step(call_text)
        self.view.add(OWNER_POLICY, policy_ids)
        self.view.add(OWNER_TOOL, self.view.encode(OWNER_TOOL, text))
        return self._observe(info), reward, terminated, truncated, self._info(info)


class TokenObservation(_TokenViewWrapper):
    """BugFix-v0 with token-id actions and a token-array observation.

    ## Action Space
    ``MultiDiscrete([vocab_size] * max_call_tokens)``: the call as token ids. Ids after the
    first ``<eoc>`` or ``<pad>`` are ignored; the ids up to it are decoded with
    ``tokenizer.decode`` into the call text (``[edit, fix_init, <eoc>, ...]`` ->
    ``"edit fix_init"``). The view records the given ids up to and including that
    terminator (all ``max_call_tokens`` ids when there is none) with owner 2.

    ## Observation Space
    ``Dict(ids=Box(int64), owner=Box(int8), attention_mask=Box(int8))``, each ``[max_len]``:
    the whole episode so far, see :mod:`bugfix_gym.views.wrappers`.

    :param env: a BugFix-v0 env (``gym.make("BugFix-v0")`` or ``BugFixEnv()``)
    :param tokenizer: defaults to :func:`default_tokenizer`
    :param max_len: padded observation length
    :param max_call_tokens: token ids per action
    """

    def __init__(self, env: gym.Env, tokenizer: TokenizerLike | None = None, max_len: int = 512,
                 max_call_tokens: int = 8):
        gym.utils.RecordConstructorArgs.__init__(self, tokenizer=tokenizer, max_len=max_len,
                                                 max_call_tokens=max_call_tokens)  # env.spec can rebuild the view
        super().__init__(env, tokenizer, max_len)
        self._token_actions(max_call_tokens)

    def policy_ids(self, action: Sequence[int]) -> list[int]:
        """The ids of ``action`` the view records: up to and including the first ``<eoc>`` / ``<pad>``."""
        return call_ids(action, self.tokenizer, self.max_call_tokens, "TokenObservation")

    def step(self, action):
        ids = self.policy_ids(action)
        text = self.tokenizer.decode(ids[:-1] if ids and ids[-1] == self.tokenizer.pad_id else ids)
        return self._step_text(text, ids)


class DiscreteCalls(_TokenViewWrapper):
    """BugFix-v0 with ``Discrete(9)`` actions over :data:`bugfix_gym.CALLS` and a call mask.

    ## Action Space
    ``Discrete(9)``: index into ``CALLS`` (``read``, ``test``, five ``edit`` ops, ``revert``,
    ``submit``). An illegal call (``revert`` before any change) is played as the env plays
    it: an invalid call that costs the turn.

    ## Observation Space
    The call mask is ``Box(0, 1, (9,), bool)``, True where the call is legal now (the text
    env's ``info["call_mask"]``, or with ``mask="useful_calls"`` its ``info["useful_calls"]``,
    which also closes the calls the episode has shown to be useless); :meth:`action_masks`
    returns it too (sb3-contrib ``MaskablePPO``). ``layout`` puts it and the tokens under the keys a library reads:

    * ``"dict"`` (default; SB3, sb3-contrib, TorchRL's ``ActionMask`` transform):
      the token view of :class:`TokenObservation` (``ids``, ``owner``,
      ``attention_mask``) plus ``action_mask``;
    * ``"tianshou"``: ``{"obs": tokens, "mask": call mask}`` (Tianshou reads
      ``batch.obs.mask``; its DQN masks with it);
    * ``"rllib"``: ``{"observations": tokens, "action_mask": call mask}`` (RLlib's
      action-masking RLModule).

    ``tokens`` is one flat ``Box(float32, [2 * max_len])``: the ``ids`` then the ``owner``
    codes, so that a library's default MLP encoder reads it as it is (SB3's
    ``MultiInputPolicy`` flattens the ``"dict"`` layout the same way).

    :param env: a BugFix-v0 env
    :param tokenizer: defaults to :func:`default_tokenizer`
    :param max_len: padded observation length
    :param layout: ``"dict"``, ``"tianshou"`` or ``"rllib"``
    :param mask: the text env's ``info`` key the call mask comes from: ``"call_mask"`` or ``"useful_calls"``
    """

    def __init__(self, env: gym.Env, tokenizer: TokenizerLike | None = None, max_len: int = 512,
                 layout: Layout = "dict", mask: str = "call_mask"):
        gym.utils.RecordConstructorArgs.__init__(self, tokenizer=tokenizer, max_len=max_len, layout=layout, mask=mask)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")
        if mask not in ("call_mask", "useful_calls"):
            raise ValueError(f"mask must be 'call_mask' or 'useful_calls', got {mask!r}")
        self.mask_key = mask
        super().__init__(env, tokenizer, max_len)
        self.layout = layout
        self.action_space = spaces.Discrete(len(CALLS))
        mask_space = spaces.Box(0, 1, shape=(len(CALLS),), dtype=np.bool_)  # type: ignore[arg-type]
        self.observation_space = self._masked_space(layout, mask_space)
        self._mask = np.zeros(len(CALLS), dtype=bool)

    def _observe(self, info: dict[str, Any]) -> dict[str, np.ndarray]:
        self._mask = np.array(info[self.mask_key], dtype=bool)
        arrays = self.view.arrays()
        if self.layout == "dict":
            arrays["action_mask"] = self._mask.copy()
            return arrays
        tokens = np.concatenate([arrays["ids"], arrays["owner"]]).astype(np.float32)  # [2 * max_len]
        if self.layout == "tianshou":
            return {"obs": tokens, "mask": self._mask.copy()}
        return {"observations": tokens, "action_mask": self._mask.copy()}

    def action_masks(self) -> np.ndarray:
        """bool[9]: which calls are open now (legal, or useful with ``mask="useful_calls"``; sb3-contrib
        convention)."""
        return self._mask.copy()

    def step(self, action):
        arr = np.asarray(action)
        if isinstance(action, (bool, np.bool_)) or arr.size != 1 or not np.issubdtype(arr.dtype, np.integer):
            raise TypeError(f"DiscreteCalls actions are integer call indices 0..{len(CALLS) - 1}, got {action!r}")
        index = int(arr.reshape(-1)[0])
        if not 0 <= index < len(CALLS):
            raise ValueError(f"DiscreteCalls actions are call indices 0..{len(CALLS) - 1}, got {index}")
        call = CALLS[index]
        return self._step_text(call, encode_segment(self.tokenizer, OWNER_POLICY, call))


def make_discrete_calls(tokenizer: TokenizerLike | None = None, max_len: int = 512, layout: Layout = "dict",
                        **env_kwargs: Any) -> DiscreteCalls:
    """``DiscreteCalls(gym.make("BugFix-v0", **env_kwargs), ...)`` without gym.make's own checking wrappers:
    the entry point of ``BugFixCalls-v0``."""
    return DiscreteCalls(make_bugfix_env(**env_kwargs), tokenizer, max_len, layout)


def make_token_observation(tokenizer: TokenizerLike | None = None, max_len: int = 512, max_call_tokens: int = 8,
                           **env_kwargs: Any) -> TokenObservation:
    """``TokenObservation(gym.make("BugFix-v0", **env_kwargs), ...)`` without gym.make's own checking wrappers:
    the entry point of ``BugFixTokens-v0``."""
    return TokenObservation(make_bugfix_env(**env_kwargs), tokenizer, max_len, max_call_tokens)
