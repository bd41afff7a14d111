"""TinyAgentPolicy: the TinyAgent wrapped as a Stable-Baselines3 policy.

The policy holds the model (``policy.model``), the tokenizer (``policy.tokenizer``) and the
optimizer (``policy.optimizer``, SB3's convention) and, optionally, the legal-call grammar
its decoding is constrained to (``policy.grammar``). Training never goes through
``forward``: the algorithms sample whole episodes with :class:`agents.rollout.sampler.EpisodeSampler`
and score them with :func:`agents.model.tinyagent.score_tokens`. ``predict`` is SB3's entry point for
acting (``evaluate_policy``, ``EvalCallback``, user loops); it writes calls with the same
decoder as the sampler, and what it expects is documented on :meth:`TinyAgentPolicy.predict`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence, cast

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.type_aliases import Schedule

from bugfix_gym.contract.tokens import (
    OWNER_PAD, OWNER_PROMPT, OWNER_TOOL, TokenizerLike, encode_segment, tokenizer_from_dict)

from agents.decoding.grammar import CallGrammar
from agents.decoding.legal_calls import LEGAL_CALLS_KEY, LegalCallGrammar
from agents.model.hf_adapter import HFAgent, config_dict, lm_from_config
from agents.model.threads import ThreadSetting, use_threads
from agents.model.tinyagent import TinyAgent, TinyAgentConfig
from agents.decoding.foresight import Foresight
from agents.decoding.decoder import write_calls

# keys under which a token-view observation (bugfix_gym.views.wrappers.TokenObservation) may hold its arrays
_IDS_KEYS = ("ids", "input_ids", "token_ids", "tokens")
_OWNER_KEYS = ("owner", "owners", "owner_ids")


class TinyAgentPolicy(BasePolicy):
    """TinyAgent (decoder-only transformer, LM head = policy, value head = critic) as an SB3 policy.

    :param observation_space: the env's observation space (``Text`` for BugFix-v0, or the
        ``Dict`` of the token-view wrapper)
    :param action_space: the env's action space (``Text``: the call as a string)
    :param lr_schedule: learning-rate schedule; the optimizer starts at ``lr_schedule(1)``
    :param tokenizer: the tokenizer (a ``Tokenizer``, any :class:`bugfix_gym.contract.tokens.TokenizerLike` such as
        :class:`bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`, or its ``to_dict()``); required
        (TokenPPO and Reinforce pass the one in their ``policy_kwargs``, or the env's advertised default)
    :param model_config: ``TinyAgentConfig`` fields as a dict (or the dataclass); default sizes
        with the tokenizer's vocabulary
    :param max_call_tokens: the most tokens one call may have (``<eoc>`` included)
    :param call_grammar: the legal calls (e.g. ``bugfix_gym.CALLS``): decoding is then constrained to
        them (:class:`agents.decoding.grammar.CallGrammar`), in sampling and in scoring; None writes free text
    :param call_mask_key: with ``call_grammar``, the env ``info`` key of a call mask the sampler follows:
        each call starts from the calls that mask leaves open (BugFix-v0: ``"call_mask"``, the legal
        calls, or ``"useful_calls"``, which also closes edits the episode has shown to be useless).
        None: every call of the grammar is always open. ``predict`` sees no ``info`` and ignores it
    :param legal_calls: decode under the env's legal calls of each turn instead of a fixed ``call_grammar``
        (BugFix-v1 through :class:`agents.decoding.legal_calls.LegalCallsInfo`; ``call_mask_key="legal_calls"``)
    :param foresight: with ``call_grammar``, a threshold in (0, 1]: before the policy picks an edit's op,
        the ops its own model gives a probability above it of answering ``no change`` are closed
        (:class:`agents.decoding.foresight.Foresight`); None: off
    :param foresight_words: the words foresight reads, as :class:`~agents.decoding.foresight.Foresight`'s
        ``op_prefix`` and ``no_change`` (the algorithms pass the env's ``metadata["agent_defaults"]["foresight"]``);
        needed with ``foresight``, kept in saved files so ``eval --foresight`` needs no env
    :param foresight_teach: with ``foresight``, it closes the ops for sampling only and the tokens are
        scored under the grammar (and call mask) alone (``Foresight(teach=True)``): training rolls out
        with foresight and a loss teaches the policy its choices, so the model can decode without it
    :param model: a ``transformers`` causal LM to train instead of a TinyAgent (wrapped with a value head in
        :class:`agents.model.hf_adapter.HFAgent`; its vocabulary must be the tokenizer's; trained in place).
        Not saved as such: the algorithms save its config (``hf_config``) and its weights
    :param hf_config: the config of such an LM as JSON data (``config.to_dict()``): the policy builds it with
        random weights (a model file's weights then replace them); ignored when ``model`` is given
    :param optimizer_class: optimizer class (``Adam``)
    :param optimizer_kwargs: extra optimizer arguments, not the learning rate (default for Adam:
        ``eps=1e-5`` as SB3's PPO, and ``foreach=True``: the same update, computed over all parameters at once)
    :param use_sde: accepted for SB3's constructor call; must be False
    """

    #: torch threads ``predict`` runs under (:mod:`agents.model.threads`; the algorithms set their own)
    torch_threads: ThreadSetting = "auto"

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Schedule,
        tokenizer: TokenizerLike | dict | None = None,
        model_config: TinyAgentConfig | dict | None = None,
        max_call_tokens: int | None = None,
        call_grammar: Sequence[str] | None = None,
        call_mask_key: str | None = None,
        legal_calls: bool = False,
        foresight: float | None = None,
        foresight_words: dict[str, Any] | None = None,
        foresight_teach: bool = False,
        model: th.nn.Module | None = None,
        hf_config: dict[str, Any] | None = None,
        optimizer_class: type[th.optim.Optimizer] = th.optim.Adam,
        optimizer_kwargs: dict[str, Any] | None = None,
        use_sde: bool = False,
    ):
        if use_sde:
            raise ValueError("TinyAgentPolicy samples tokens from a categorical distribution; use_sde must be False")
        if optimizer_kwargs is None and optimizer_class is th.optim.Adam:
            # SB3's PPO default. With torch's 1e-8, Adam blows the tiny, consistent gradients that
            # reach rare tokens' logits (through the softmax and the tied embedding) up to full
            # learning-rate steps (docs/ppo.md).
            optimizer_kwargs = {"eps": 1e-5, "foreach": True}  # foreach: one fused update over all tensors
        super().__init__(observation_space, action_space, optimizer_class=optimizer_class,
                         optimizer_kwargs=optimizer_kwargs)
        if tokenizer is None:
            raise ValueError("TinyAgentPolicy needs a tokenizer (the algorithms pass the env's default, or "
                             "policy_kwargs=dict(tokenizer=...))")
        self.tokenizer = tokenizer_from_dict(tokenizer) if isinstance(tokenizer, dict) else tokenizer
        self.hf_config = None if model is None and hf_config is None else (
            config_dict(model) if model is not None else dict(hf_config or {}))
        tiny_config = self._tiny_config(model_config) if self.hf_config is None else None
        if max_call_tokens is None:
            raise ValueError("TinyAgentPolicy needs max_call_tokens (the algorithms pass their setting of that name)")
        self.max_call_tokens = int(max_call_tokens)
        self.call_grammar = tuple(call_grammar) if call_grammar else None
        self.legal_calls = bool(legal_calls)
        self.grammar = self._grammar(call_grammar, call_mask_key)
        if self.grammar is not None and self.grammar.max_call_tokens > self.max_call_tokens:
            raise ValueError(f"the longest legal call needs {self.grammar.max_call_tokens} tokens (with <eoc>), "
                             f"more than max_call_tokens={self.max_call_tokens}")
        if call_mask_key is not None and self.grammar is None:
            raise ValueError(f"call_mask_key={call_mask_key!r} needs a call grammar (call_grammar=...): the call "
                             "mask closes calls of the grammar")
        self.call_mask_key = call_mask_key
        if foresight is not None and (self.grammar is None or self.legal_calls):
            raise ValueError("foresight needs a fixed call grammar (call_grammar=...): it closes edit ops of the "
                             "grammar")
        self.foresight_words = None if foresight_words is None else dict(foresight_words)
        self.foresight = None if foresight is None else self.make_foresight(foresight, foresight_teach)
        self.model = TinyAgent(tiny_config) if tiny_config is not None else self._hf_agent(model, self.hf_config or {})
        context = int(self.model.config.max_len)
        if not 1 <= self.max_call_tokens <= context // 2:
            raise ValueError(f"max_call_tokens={self.max_call_tokens} must be from 1 to half the model's context of "
                             f"{context} tokens (a call needs room for the prompt before it)")
        self.optimizer = self.optimizer_class(self.parameters(), lr=lr_schedule(1),  # type: ignore[call-arg]
                                              **self.optimizer_kwargs)

    def make_foresight(self, threshold: float, teach: bool = False) -> Foresight:
        """Foresight at ``threshold`` on this policy's grammar, with its ``foresight_words``, or a ``ValueError``."""
        if self.foresight_words is None:
            raise ValueError("foresight reads words the env advertises (metadata['agent_defaults']['foresight']); "
                             "this env advertises none: pass policy_kwargs=dict(foresight_words=dict(op_prefix=..., "
                             "no_change=[...]))")
        if not isinstance(self.grammar, CallGrammar) or self.legal_calls:
            raise ValueError("foresight needs a fixed call grammar (call_grammar=...): it closes ops of the grammar")
        return Foresight(self.grammar, self.tokenizer, threshold, teach=teach, **self.foresight_words)

    def _grammar(self, call_grammar: Sequence[str] | None,
                 call_mask_key: str | None) -> CallGrammar | LegalCallGrammar | None:
        """The call grammar: the fixed ``call_grammar``'s, or with ``legal_calls`` the env's legal calls of each
        turn (:class:`agents.decoding.legal_calls.LegalCallGrammar`, read from ``info[call_mask_key]``)."""
        if not self.legal_calls:
            return CallGrammar(self.tokenizer, self.call_grammar) if self.call_grammar else None
        if call_grammar or call_mask_key != LEGAL_CALLS_KEY:
            raise ValueError(f"legal_calls=True reads each turn's calls from info[{LEGAL_CALLS_KEY!r}]: pass "
                             f"call_mask_key={LEGAL_CALLS_KEY!r} and no call_grammar")
        return LegalCallGrammar(self.tokenizer, self.max_call_tokens)

    def _tiny_config(self, model_config: TinyAgentConfig | dict | None) -> TinyAgentConfig:
        """The TinyAgent config of ``model_config`` (default sizes with the tokenizer's vocabulary)."""
        if model_config is None:
            model_config = TinyAgentConfig(vocab_size=self.tokenizer.vocab_size)
        elif isinstance(model_config, dict):
            model_config = TinyAgentConfig(**model_config)
        if model_config.vocab_size != self.tokenizer.vocab_size:
            raise ValueError(f"model_config.vocab_size ({model_config.vocab_size}) differs from the tokenizer's "
                             f"vocabulary ({self.tokenizer.vocab_size})")
        self.model_config: TinyAgentConfig | None = model_config
        return model_config

    def _hf_agent(self, lm: th.nn.Module | None, hf_config: dict[str, Any]) -> TinyAgent:
        """The HF causal LM ``lm`` (or one built from ``hf_config``) with a value head, behind TinyAgent's
        interface (:class:`agents.model.hf_adapter.HFAgent`)."""
        if lm is None:
            lm = lm_from_config(hf_config)
        vocab = lm.get_output_embeddings().weight.shape[0]  # type: ignore[operator]
        if vocab != self.tokenizer.vocab_size:
            raise ValueError(f"the HF model's vocabulary ({vocab}) differs from the tokenizer's "
                             f"({self.tokenizer.vocab_size}): call model.resize_token_embeddings("
                             f"{self.tokenizer.vocab_size}) or use the model's own tokenizer")
        self.model_config = None
        return cast(TinyAgent, HFAgent(lm))  # HFAgent has TinyAgent's interface (agents/model/hf_adapter.py)

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(tokenizer=self.tokenizer.to_dict(),
                    model_config=None if self.model_config is None else dataclasses.asdict(self.model_config),
                    hf_config=self.hf_config,
                    max_call_tokens=self.max_call_tokens, call_grammar=self.call_grammar,
                    call_mask_key=self.call_mask_key, legal_calls=self.legal_calls,
                    foresight=None if self.foresight is None else self.foresight.threshold,
                    foresight_words=self.foresight_words,
                    foresight_teach=self.foresight is not None and self.foresight.teach,
                    optimizer_class=self.optimizer_class,
                    optimizer_kwargs=self.optimizer_kwargs, lr_schedule=self._dummy_schedule)
        return data

    def sampler_kwargs(self) -> dict[str, Any]:
        """How this policy writes calls, as :class:`agents.rollout.sampler.EpisodeSampler` keyword arguments."""
        return dict(max_call_tokens=self.max_call_tokens, grammar=self.grammar, call_mask_key=self.call_mask_key,
                    foresight=self.foresight)

    # ------------------------------------------------------------------ acting
    def forward(self, ids: th.Tensor) -> tuple[th.Tensor, th.Tensor]:
        """Full causal forward: ids [B, T] -> (logits [B, T, V], values [B, T])."""
        return self.model(ids)

    @th.no_grad()
    def generate_calls(self, prefixes: Sequence[Sequence[int]], deterministic: bool = False,
                       generator: th.Generator | None = None) -> list[list[int]]:
        """Write one call for each token prefix (the episode so far) with the one decoder,
        :func:`agents.decoding.decoder.write_calls` (KV cache; the call grammar if the policy has one).

        Prefixes longer than the model's context keep their last tokens.

        :param prefixes: token ids of each episode so far
        :param deterministic: greedy (argmax) decoding instead of sampling at temperature 1
        :param generator: seeds the sampling
        :return: each call's token ids (``<eoc>`` included when it was written)
        """
        keep = self.model.config.max_len - self.max_call_tokens
        feed = [list(p)[-keep:] for p in prefixes]
        cache = self.model.new_cache(len(feed))
        was_training = self.model.training
        self.model.eval()
        try:
            calls = write_calls(self.model, cache, feed, [bool(f) for f in feed], self.tokenizer.eoc_id,
                                max_call_tokens=self.max_call_tokens, grammar=self.grammar,
                                deterministic=deterministic, generator=generator, foresight=self.foresight)
        finally:
            self.model.train(was_training)
        return calls.tokens

    def _calls_to_array(self, calls: list[list[int]]) -> np.ndarray:
        """Call token ids -> int64 [n, max_call_tokens], right-padded with ``pad_id``."""
        out = np.full((len(calls), self.max_call_tokens), self.tokenizer.pad_id, dtype=np.int64)
        for i, c in enumerate(calls):
            out[i, : len(c)] = c
        return out

    def _predict(self, observation: th.Tensor, deterministic: bool = False) -> th.Tensor:
        """Token ids of the episodes so far [B, T] (right-padded with ``pad_id``) -> call ids
        [B, max_call_tokens] (right-padded with ``pad_id``)."""
        pad = self.tokenizer.pad_id
        prefixes = [[t for t in row.tolist() if t != pad] for row in observation]
        return th.as_tensor(self._calls_to_array(self.generate_calls(prefixes, deterministic)))

    def predict(
        self,
        observation: str | np.ndarray | Sequence[str] | dict[str, np.ndarray],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[np.ndarray | str, tuple[np.ndarray, ...] | None]:
        """The next call(s) of each episode.

        Two kinds of observation are accepted:

        * **Token view** (``dict`` from ``bugfix_gym.views.wrappers.TokenObservation``: token ids of
          the whole episode so far and their owner codes, ``[T]`` or ``[n_envs, T]``). It holds
          the history, so ``state`` is not needed and is returned unchanged. The actions are
          then that wrapper's: each call as ``max_call_tokens`` token ids (int64, ending at
          ``<eoc>``, right-padded with ``<pad>``).
        * **Text** (BugFix-v0's own observation: a ``str``, or an array of strings from a
          :class:`agents.rollout.vec_env.TextDummyVecEnv`). A text observation is only the latest tool
          output, so the episode history travels in ``state``, as for SB3's recurrent policies:
          pass back the ``state`` this method returned, and ``episode_start`` (True where an
          episode begins; SB3's ``evaluate_policy`` does both). Without ``state`` every
          observation is taken as the first one of an episode (the prompt).

        :param observation: the observation(s)
        :param state: ``(histories,)``, an object array of per-env token-id lists, from the previous call
        :param episode_start: bool [n_envs], True where an episode starts (history reset)
        :param deterministic: greedy decoding instead of sampling
        :return: ``(actions, state)``: one call per env (text: a string, a ``str`` for a single
            unbatched observation; token view: token ids), and the new state
        """
        self.set_training_mode(False)
        with use_threads(self.torch_threads, self.device):
            return self._predict_calls(observation, state, episode_start, deterministic)

    def _predict_calls(self, observation: Any, state: tuple[np.ndarray, ...] | None, episode_start: np.ndarray | None,
                       deterministic: bool) -> tuple[np.ndarray | str, tuple[np.ndarray, ...] | None]:
        """:meth:`predict`'s work (under the policy's thread setting)."""
        if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
            raise ValueError("predict() got an (obs, info) tuple; pass only the observation "
                             "(`obs, info = env.reset()` then `model.predict(obs)`)")
        if isinstance(observation, dict):  # token view: stateless, actions are the calls' token ids
            prefixes, single = self._token_view_prefixes(observation)
            ids = self._calls_to_array(self.generate_calls(prefixes, deterministic))
            return (ids[0] if single else ids), state
        prefixes, single, new_state = self._text_prefixes(observation, state, episode_start)
        calls = self.generate_calls(prefixes, deterministic)
        eoc = self.tokenizer.eoc_id
        for hist, c in zip(new_state[0], calls):  # remember each call as the env's transcript will hold it
            hist.extend(c if c and c[-1] == eoc else c + [eoc])
        actions = np.array([self.tokenizer.decode(c) for c in calls], dtype=object)
        return (actions[0] if single else actions), new_state

    def _token_view_prefixes(self, observation: dict[str, np.ndarray]) -> tuple[list[list[int]], bool]:
        ids_key = next((k for k in _IDS_KEYS if k in observation), None)
        if ids_key is None:
            raise ValueError(f"a dict observation needs token ids under one of {_IDS_KEYS}; got keys "
                             f"{sorted(observation)}")
        ids = np.asarray(observation[ids_key])
        single = ids.ndim == 1
        ids = ids.reshape(-1, ids.shape[-1])
        owner_key = next((k for k in _OWNER_KEYS if k in observation), None)
        if owner_key is not None:
            keep = np.asarray(observation[owner_key]).reshape(ids.shape) != OWNER_PAD
        else:
            keep = ids != self.tokenizer.pad_id
        return [row[k].astype(np.int64).tolist() for row, k in zip(ids, keep)], single

    def _text_prefixes(self, observation, state, episode_start):
        single = isinstance(observation, str)
        texts = [observation] if single else [str(o) for o in np.asarray(observation, dtype=object).reshape(-1)]
        n = len(texts)
        old = None if state is None else state[0]
        if old is not None and len(old) != n:
            raise ValueError(f"state holds {len(old)} histories but {n} observations were given")
        starts = np.ones(n, dtype=bool) if old is None else (
            np.zeros(n, dtype=bool) if episode_start is None else np.asarray(episode_start, dtype=bool).reshape(n))
        histories = np.empty(n, dtype=object)
        for i, text in enumerate(texts):
            if starts[i]:
                histories[i] = encode_segment(self.tokenizer, OWNER_PROMPT, text)
            else:
                histories[i] = list(old[i]) + encode_segment(self.tokenizer, OWNER_TOOL, text)
        return [list(h) for h in histories], single, (histories,)
