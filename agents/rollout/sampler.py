"""The episode sampler: :class:`EpisodeSampler` drives any Stable-Baselines3 ``VecEnv`` of text
environments through ``step_async(list[str])`` / ``step_wait`` in lockstep, with SB3's auto-reset and
``info["terminal_observation"]``, and returns whole episodes as
:class:`~agents.rollout.trajectory.Trajectory`. Its tokens come only from what the env returns (the
reset observation is the prompt, every step's observation the tool output) and from the policy's own
calls."""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Sequence

import numpy as np
import torch
from stable_baselines3.common.vec_env import VecEnv

from bugfix_gym.contract.tokenizer import split_words
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, TokenizerLike, encode_segment

from agents.decoding.decoder import DEFAULT_MAX_CALL_TOKENS, write_calls
from agents.decoding.foresight import Foresight
from agents.decoding.grammar import NO_STATE, CallGrammar
from agents.model.tinyagent import KVCache, TinyAgent
from agents.rollout.trajectory import EpisodeRecord, Trajectory, same_return


@dataclasses.dataclass(frozen=True)
class GroupSampling:
    """How a sampler plays its episodes in groups: the piece of the algorithms' settings it needs (the
    defaults of their ``group_size``, ``drop_zero_variance_groups`` and ``max_resample_rounds``, which
    agents/algorithms/config.py reads from here). The default plays no groups.

    :param group_size: G, the episodes of one group: a fresh batch is played in groups of G episodes
        that start from one reset (the same seed, so the same task on any env that draws it from
        ``reset(seed=...)``), in lockstep rounds (:meth:`EpisodeSampler._play_groups`); 1: no groups
    :param drop_zero_variance_groups: dynamic sampling: drop the groups whose returns are all equal
        and play more groups until the batch is full (:meth:`EpisodeSampler._collect_groups`)
    :param max_resample_rounds: with dynamic sampling, the most extra plays of groups per batch; a
        batch still short after them is returned as it is, with a warning
    """

    group_size: int = 1
    drop_zero_variance_groups: bool = False
    max_resample_rounds: int = 4


# ---------------------------------------------------------------------- the episode sampler
StepHook = Callable[[np.ndarray, list, np.ndarray, np.ndarray], bool]


class EpisodeSampler:
    """Plays a TinyAgent in a ``VecEnv`` of text environments and returns whole episodes.

    By default every :meth:`collect` is an on-policy batch: the envs are reset and each env
    records its next ``ceil(n_episodes / n_envs)`` episodes, sampled by the current policy.
    With ``fresh=False`` the sampler keeps each sub-environment's episode so far between calls:
    an episode still running when a batch is complete continues in the next one (with the
    policy of that time), so no env step is wasted and every episode is used once and whole.
    Each :meth:`collect` starts a new KV cache (and re-reads episodes in progress with the
    current weights).

    An episode that would outgrow the model's context (``max_len``) has its tool outputs cut
    to fit; when not even the next call fits, the rest of the episode is played with
    ``filler`` calls and not recorded (``info["context_cut"]``).

    :param venv: the vector env; its observations and actions are text
    :param tokenizer: the policy's tokenizer (unknown words become ``<unk>``): a ``Tokenizer`` or any
        :class:`bugfix_gym.contract.tokens.TokenizerLike` (a chat-template tokenizer: its segments are the
        template's, :class:`bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`)
    :param max_call_tokens: the most tokens one call may have (``<eoc>`` included)
    :param grammar: constrain calls to a legal-call grammar (None: free text)
    :param filler: the call sent for an env whose episode is no longer recorded
    :param asynchronous: step each env as soon as its call is written, through the vector env's
        ``send`` / ``receive`` (:class:`agents.RayVecEnv` has them), instead of all envs in lockstep:
        faster when tools are slow, not reproducible (the order of events depends on timing)
    :param call_mask_key: with a grammar, start each call from the env's call mask ``info[call_mask_key]``
        (bool per grammar call, in the grammar's order; BugFix-v0: ``"call_mask"`` or ``"useful_calls"``),
        so closed calls cannot be written; None: every legal call is open
    :param foresight: with a grammar, close the edit ops the model expects to answer ``no change``
        (:class:`Foresight`)
    :param groups: how episodes are played in groups (:class:`GroupSampling`; default: no groups)
    :param warn_unknown_words: warn (once) the first time an observation holds words outside the
        tokenizer's vocabulary, which become ``<unk>`` (the algorithms turn it on for an env that
        advertises no tokenizer of its own; BugFix-v0's ``fixed_tokenizer`` makes ``<unk>`` of
        names on purpose)

    A prompt (reset observation) that leaves no room for one call in the model's context is a
    one-line ``ValueError`` naming the ``max_len`` it needs.
    """

    def __init__(self, venv: VecEnv, tokenizer: TokenizerLike, max_call_tokens: int = DEFAULT_MAX_CALL_TOKENS,
                 grammar: CallGrammar | None = None, filler: str = "", asynchronous: bool = False,
                 call_mask_key: str | None = None, foresight: Foresight | None = None,
                 groups: GroupSampling = GroupSampling(), warn_unknown_words: bool = False):
        if asynchronous and not (hasattr(venv, "send") and hasattr(venv, "receive")):
            raise ValueError(f"asynchronous stepping needs a vector env with send() / receive() (e.g. "
                             f"agents.RayVecEnv); {type(venv).__name__} steps all envs in lockstep only")
        check_groups(groups.group_size, groups.drop_zero_variance_groups, groups.max_resample_rounds, asynchronous)
        self.group_size = int(groups.group_size)
        self.drop_zero_variance_groups = bool(groups.drop_zero_variance_groups)
        self.max_resample_rounds = int(groups.max_resample_rounds)
        #: of the last grouped collection: groups played, the share of them with all-equal returns, and
        #: how many were played to replace dropped ones (None before any grouped collection)
        self.group_stats: dict[str, float] | None = None
        self.asynchronous = asynchronous
        self.venv = venv
        self.tok = tokenizer
        self.max_call_tokens = int(max_call_tokens)
        self.grammar = grammar
        self.call_mask_key = call_mask_key
        self.foresight = foresight
        self.filler = filler
        self.episodes: list[EpisodeRecord] | None = None
        self._cache: KVCache | None = None
        self._cache_model_type: type | None = None  # the model class that made the cache
        self.warn_unknown_words = bool(warn_unknown_words)  # set to False once it has warned

    def restart(self, observations: Sequence[Any] | None = None) -> None:
        """Start every sub-environment's episode from ``observations`` (default: ``venv.reset()``)."""
        obs = self.venv.reset() if observations is None else observations
        texts = _texts(obs, self.venv.num_envs)
        self.episodes = [self._new_episode(o, self._reset_info(b)) for b, o in enumerate(texts)]

    def _reset_info(self, b: int) -> dict:
        """The info of env ``b``'s latest reset (SB3's ``VecEnv.reset_infos``; empty when it has none)."""
        infos = getattr(self.venv, "reset_infos", None)
        return infos[b] if infos is not None and b < len(infos) and isinstance(infos[b], dict) else {}

    def call_start(self, info: dict) -> int:
        """The grammar state the next call starts in, after a step (or reset) that returned ``info``."""
        if self.grammar is None:
            return NO_STATE
        if self.call_mask_key is None or self.call_mask_key not in info:
            return self.grammar.start
        # a call mask (CallGrammar), or the legal calls themselves (LegalCallGrammar): each grammar reads its own
        return self.grammar.start_for(info[self.call_mask_key])

    def get_state(self) -> list[dict[str, Any]] | None:
        """The episodes in progress as plain data (to stop and resume a training run)."""
        if self.episodes is None:
            return None
        keys = ("ids", "owner", "logp", "rewards", "states", "cut", "call_start")
        return [{k: getattr(ep, k) for k in keys} for ep in self.episodes]

    def set_state(self, state: list[dict[str, Any]] | None) -> None:
        """Restore what :meth:`get_state` returned (critic values are recomputed at the next collect)."""
        if state is None:
            self.episodes = None
            return
        if len(state) != self.venv.num_envs:
            raise ValueError(f"the saved sampler state has {len(state)} episodes for {self.venv.num_envs} envs")
        self.episodes = []
        for data in state:
            ep = EpisodeRecord([])
            for k in ("ids", "owner", "logp", "rewards", "states"):
                setattr(ep, k, list(data[k]))
            ep.cut = bool(data["cut"])
            ep.call_start = int(data.get("call_start", CallGrammar.start))
            self.episodes.append(ep)

    def _cache_for(self, model: TinyAgent) -> KVCache:
        """An empty KV cache for the envs, reusing the last one's memory when it fits: every row starts
        at length 0 and the stale keys and values beyond a row's length are never attended to. A model
        class that keeps another kind of cache (its own ``new_cache``) gets a new one each time."""
        cache = self._cache
        if not (isinstance(cache, KVCache) and type(model) is self._cache_model_type
                and cache.fits(model.config, self.venv.num_envs, model.tok_emb.weight.dtype)):
            cache = self._cache = model.new_cache(self.venv.num_envs)
            self._cache_model_type = type(model)
        cache.lengths.zero_()
        return cache

    def _encode(self, owner: int, text: str) -> list[int]:
        """``encode_segment`` of an observation; the first one with unknown words warns (if asked to)."""
        ids = encode_segment(self.tok, owner, text)
        if self.warn_unknown_words and self.tok.unk_id in ids:
            self.warn_unknown_words = False
            known = getattr(self.tok, "ids", {})  # a word list: ours only (another tokenizer names no words)
            unknown = sorted({w for w in split_words(text) if w not in known})
            warnings.warn(f"an observation has {len(unknown)} word(s) the tokenizer does not know, e.g. "
                          f"{unknown[:5]}: they become <unk>, which the policy can neither read nor write; build "
                          f"the Tokenizer from the env's words (warned once)", stacklevel=2)
        return ids

    def check_prompt_fits(self, ep: EpisodeRecord, max_len: int) -> None:
        """A one-line ``ValueError`` when the prompt of ``ep`` leaves no room for a call in ``max_len`` positions."""
        need = len(ep.ids) + self.max_call_tokens
        if need > max_len:
            raise ValueError(f"a prompt of {len(ep.ids)} tokens and one call of up to {self.max_call_tokens} "
                             f"need {need} positions, more than the model's max_len={max_len}: build it with a "
                             f"model_config max_len that holds a whole episode (prompt, calls and tool outputs)")

    def _new_episode(self, prompt: Any, info: dict) -> EpisodeRecord:
        ep = EpisodeRecord(self._encode(OWNER_PROMPT, str(prompt)))
        ep.call_start = self.call_start(info)
        return ep

    def collect(self, model: TinyAgent, n_episodes: int, *, fresh: bool = True,
                generator: torch.Generator | None = None, temperature: float = 1.0, deterministic: bool = False,
                max_env_steps: int | None = None, on_step: StepHook | None = None) -> list[Trajectory]:
        """Play the envs until ``n_episodes`` (or more) episodes have finished; return them in finishing order.

        :param model: the policy (sampled in eval mode, no grad)
        :param n_episodes: how many episodes the batch needs (at least)
        :param fresh: on-policy batches: the envs are reset and each records its next
            ``ceil(n_episodes / n_envs)`` episodes, all sampled now. In lockstep with several envs
            that happens in rounds of one episode per env (each round resets the envs), and an env
            that has its episode waits with the ``filler`` call (for BugFix-v0 an empty, invalid call)
            until the round is over; its unfinished episode is dropped at the next reset, so none of
            these ever finishes or reaches Monitor (:meth:`_rounds`). With asynchronous stepping an
            env that has its episodes simply is not stepped. False: episodes still
            running when the batch is full continue in the next batch, played by the policy of that
            time (no env step is wasted, but long episodes reach the trainer later and partly
            off-policy)
        :param generator: seeds the sampling
        :param temperature: sampling temperature (1.0: the model's own distribution)
        :param deterministic: greedy decoding
        :param max_env_steps: stop once this many env steps were taken, even if fewer episodes finished
        :param on_step: called after every step with ``(dones, infos, rewards, recorded)`` of the envs
            that stepped (all of them in lockstep); ``recorded[i]`` says that env ``i`` finished an
            episode of the batch. Returning False stops the collection
        """
        B = self.venv.num_envs
        decoding = dict(generator=generator, temperature=temperature, deterministic=deterministic)
        if self.group_size > 1:
            if not fresh:
                raise ValueError(f"group_size={self.group_size} plays fresh batches only (every group starts "
                                 "from its own reset): use fresh=True (fresh_batches=True)")
            return self._collect_groups(model, n_episodes, _StepBudget(max_env_steps, on_step), decoding)
        if fresh and not self.asynchronous and n_episodes > B > 1:  # one env never waits: no rounds needed
            return self._rounds(model, -(-n_episodes // B), max_env_steps, on_step, decoding)
        if fresh or self.episodes is None:
            self.restart()
        quota = [-(-n_episodes // B)] * B if fresh else None
        collection = self._play(model, quota, n_episodes, max_env_steps=max_env_steps, on_step=on_step,
                                decoding=decoding)
        if fresh:
            self.episodes = None  # the episodes in progress are not part of any batch: start over next time
        return [traj for _, traj in collection.finished]

    def _rounds(self, model: TinyAgent, rounds: int, max_env_steps: int | None, on_step: StepHook | None,
                decoding: dict[str, Any]) -> list[Trajectory]:
        """A fresh lockstep batch of ``rounds`` episodes per env, one round at a time: each round resets
        the envs and records every env's next episode. An env that is done waits with the filler
        until the slowest env's episode ends, which is sooner than its own filler episode can end
        (in BugFix-v0 every episode starts with the round and lasts at most ``max_turns`` turns, and a
        filler call costs a turn like any other), so no filler episode ever finishes: Monitor reports
        only the batch's episodes. In one run of several episodes per env, a waiting env's filler
        episode could run out of turns and reach Monitor. The price: more waiting (filler) steps."""
        B = self.venv.num_envs
        budget = _StepBudget(max_env_steps, on_step)
        out: list[Trajectory] = []
        for _ in range(rounds):
            if budget.spent:
                break
            out += [traj for _, traj in self._round(model, [1] * B, budget, decoding)]
        self.episodes = None
        return out

    def _round(self, model: TinyAgent, quota: list[int], budget: "_StepBudget",
               decoding: dict[str, Any]) -> list[tuple[int, Trajectory]]:
        """One round of :meth:`_rounds`: reset the envs and record the next episode of each env whose
        ``quota`` is 1 (the others send the filler); ``(env, episode)`` in finishing order."""
        self.restart()
        return self._play(model, quota, sum(quota), max_env_steps=budget.left, on_step=budget,
                          decoding=decoding).finished

    def _collect_groups(self, model: TinyAgent, n_episodes: int, budget: "_StepBudget",
                        decoding: dict[str, Any]) -> list[Trajectory]:
        """A fresh batch of ``ceil(n_episodes / G)`` groups of G episodes, group by group (each episode's
        ``group`` numbers its group in the batch). With dynamic sampling (DAPO's dynamic sampling, verl's
        ``filter_groups``), the groups whose returns are all equal are dropped and more are played, up to
        ``max_resample_rounds`` times, each time filling whole rounds of the envs (the spare groups are
        cut off at the end); a batch still short then is returned as it is, with a warning (and an empty
        one is an update skipped). :attr:`group_stats` counts the groups played."""
        n_groups = -(-n_episodes // self.group_size)
        dropping = self.drop_zero_variance_groups
        kept: list[list[Trajectory]] = []
        played = zero = resampled = 0
        for attempt in range(1 + (self.max_resample_rounds if dropping else 0)):
            if budget.spent or len(kept) >= n_groups:
                break
            groups = self._play_groups(model, self._groups_to_play(n_groups - len(kept), dropping), budget,
                                       decoding)
            all_equal = [same_return(group) for group in groups]
            played, zero = played + len(groups), zero + sum(all_equal)
            resampled += len(groups) if attempt > 0 else 0
            kept += [group for group, flat in zip(groups, all_equal) if not (dropping and flat)]
        if dropping and len(kept) < n_groups and not budget.spent:
            warnings.warn(f"dynamic sampling: after {self.max_resample_rounds} resamplings only {len(kept)} of "
                          f"{n_groups} groups have returns that differ; this batch is trained as it is (raise "
                          "max_resample_rounds, or use tasks whose outcomes vary)", stacklevel=2)
        kept = kept[:n_groups]
        for index, group in enumerate(kept):
            for traj in group:
                traj.group = index
        self.group_stats = dict(groups=played, zero_variance_groups=zero / played if played else 0.0,
                                resampled_groups=resampled)
        return [traj for group in kept for traj in group]

    def _groups_to_play(self, missing: int, fill_rounds: bool) -> int:
        """How many groups to play for ``missing`` ones: as many, or (``fill_rounds``) as many as fill
        the lockstep rounds they take, since an env left without an episode costs its steps anyway."""
        B = self.venv.num_envs
        rounds = -(-missing * self.group_size // B)
        return max(missing, rounds * B // self.group_size) if fill_rounds else missing

    def _play_groups(self, model: TinyAgent, n_groups: int, budget: "_StepBudget",
                     decoding: dict[str, Any]) -> list[list[Trajectory]]:
        """``n_groups`` groups of G episodes, each group's members reset with one seed drawn from the
        decoding generator, in lockstep rounds of one episode per env (a group's members may run on
        several envs and in several rounds; every recorded episode starts at a seeded reset, never at an
        auto-reset). Each episode records its ``group`` and ``reset_seed``; a group cut short by the
        step budget keeps the members that finished. In a last round with fewer episodes than envs, the
        spare envs send the filler from the reset on; in BugFix-v0 such a filler episode reaches Monitor
        only when the round's longest episode uses every turn."""
        B, G = self.venv.num_envs, self.group_size
        seeds = torch.randint(0, 2**31 - 1, (n_groups,), generator=decoding["generator"]).tolist()
        slots = [(group, seeds[group]) for group in range(n_groups) for _ in range(G)]  # one per episode
        members: list[list[Trajectory]] = [[] for _ in range(n_groups)]
        for start in range(0, len(slots), B):
            if budget.spent:
                break
            chunk = slots[start: start + B]
            seed_next_reset(self.venv, [seed for _, seed in chunk] + [None] * (B - len(chunk)))
            for b, traj in self._round(model, [1] * len(chunk) + [0] * (B - len(chunk)), budget, decoding):
                traj.group, traj.reset_seed = chunk[b]
                members[chunk[b][0]].append(traj)
        self.episodes = None
        return [group for group in members if group]

    def _play(self, model: TinyAgent, quota: list[int] | None, n_episodes: int,
              max_env_steps: int | None, on_step: StepHook | None, decoding: dict[str, Any]) -> "_Collection":
        """One :class:`_Collection` with this quota, played in lockstep or asynchronously (model in eval mode)."""
        collection = _Collection(self, model, quota, n_episodes, decoding)
        was_training = model.training
        model.eval()
        try:
            if self.asynchronous:
                collection.asynchronous(max_env_steps, on_step)
            else:
                collection.lockstep(max_env_steps, on_step)
            collection.finish()
        finally:
            model.train(was_training)
        return collection

    def _tool_ids(self, ep: EpisodeRecord, text: str, max_len: int) -> list[int]:
        """The tool output's tokens, cut so that the next call still fits in the context
        (its last token, the turn marker, is kept); marks the episode cut when nothing fits."""
        room = max_len - len(ep.ids) - self.max_call_tokens
        if room <= 0:
            ep.cut = True
        return cut_tool_output(self._encode(OWNER_TOOL, str(text)), room)

    def play_tasks(self, model: TinyAgent, tasks: Sequence[Any], *, generator: torch.Generator | None = None,
                   temperature: float = 1.0, deterministic: bool = False) -> list[Trajectory]:
        """One episode of each task, in order: ``venv.set_options({"task": task})`` then ``reset``,
        ``num_envs`` tasks at a time; envs whose episode is over wait with ``filler`` calls."""
        B = self.venv.num_envs
        out: list[Trajectory] = []
        for start in range(0, len(tasks), B):
            chunk = list(tasks[start: start + B])
            self.venv.set_options([{"task": t} for t in chunk] + [{}] * (B - len(chunk)))
            self.restart()
            self.venv.set_options(None)
            decoding = dict(generator=generator, temperature=temperature, deterministic=deterministic)
            collection = self._play(model, [1] * len(chunk) + [0] * (B - len(chunk)), len(chunk),
                                    max_env_steps=None, on_step=None, decoding=decoding)
            by_row = dict(collection.finished)  # each recorded env finishes exactly one episode
            out += [by_row[b] for b in range(len(chunk))]
        self.episodes = None  # the waiting envs' episodes were not recorded: start over next time
        return out


class _Collection:
    """One collection: the KV cache, what each env feeds next, how many episodes each env still records,
    and the finished episodes.

    The decoder leaves the tokens that no model call needed unfed (a call's grammar-forced end); a row
    feeds them with its next tool output (its next feed is always the episode's tokens past its
    critic values). A finished episode whose last call left such tokens keeps its cache row until
    they are fed for their critic values (:attr:`tails`): along with the next model call when the row
    has no recorded episode to start, else in one call of those rows first, and at the latest when
    the collection ends (:meth:`finish`), which builds the finished trajectories.

    :param quota: per env, how many of its next episodes to record (None: all of them, until
        ``n_episodes`` have finished); an env past its quota sends the sampler's ``filler`` call
    """

    def __init__(self, sampler: EpisodeSampler, model: TinyAgent, quota: list[int] | None, n_episodes: int,
                 decoding: dict[str, Any]):
        assert sampler.episodes is not None
        self.sampler, self.model, self.decoding = sampler, model, decoding
        self.B = sampler.venv.num_envs
        self.quota = list(quota) if quota is not None else None
        self.target = sum(quota) if quota is not None else n_episodes
        self.cache = sampler._cache_for(model)
        self.finished: list[tuple[int, Trajectory]] = []  # filled by finish()
        self.done: list[tuple[int, EpisodeRecord, dict]] = []  # finished episodes, in finishing order
        self.tails: dict[int, EpisodeRecord] = {}  # row -> a finished episode with tokens still to feed
        self.feed: list[list[int]] = []
        for b, ep in enumerate(sampler.episodes):  # a new cache: re-read the episodes in progress
            if self.records(b) and not ep.cut:
                sampler.check_prompt_fits(ep, model.config.max_len)
            ep.values = []  # with the current weights
            self.feed.append(list(ep.ids) if self.records(b) and not ep.cut else [])

    def records(self, b: int) -> bool:
        """Whether env ``b`` still records episodes (its calls come from the policy, else the filler)."""
        return self.quota is None or self.quota[b] > 0

    @property
    def complete(self) -> bool:
        return len(self.done) >= self.target

    @staticmethod
    def _tail(ep: EpisodeRecord) -> list[int]:
        """A finished episode's tokens that need critic values and were not fed: up to its last call's
        last token (which is never fed)."""
        last = len(ep.owner) - 1 - ep.owner[::-1].index(OWNER_POLICY) if OWNER_POLICY in ep.owner else 0
        return ep.ids[len(ep.values): last]

    def flush(self, rows: Sequence[int]) -> None:
        """Feed the tails of ``rows`` (rows of :attr:`tails`) in one model call; their cache rows start over."""
        if not rows:
            return
        tails = [self._tail(self.tails[b]) if b in rows else [] for b in range(self.B)]
        S = max(len(t) for t in tails)
        device = self.model.tok_emb.weight.device
        chunk = torch.tensor([t + [0] * (S - len(t)) for t in tails], dtype=torch.long, device=device)  # [B, S]
        _, values = self.model.extend(chunk, torch.tensor([len(t) for t in tails], device=device), self.cache)
        fed = values.cpu().tolist()  # [B][S]
        for b in rows:
            self.tails.pop(b).values += fed[b][: len(tails[b])]
            self.cache.lengths[b] = 0

    def finish(self) -> None:
        """Feed every tail left and build the finished trajectories (:attr:`finished`)."""
        self.flush(list(self.tails))
        self.finished = [(b, ep.trajectory(info)) for b, ep, info in self.done]

    def write(self, rows: Sequence[int]) -> tuple[list[str], list[bool]]:
        """Write the calls of ``rows`` (one model pass per token, those rows only): their actions, and
        whether each was written by the policy (else it is the filler)."""
        eps = self.sampler.episodes
        assert eps is not None
        writing = [False] * self.B
        for b in rows:
            writing[b] = self.records(b) and not eps[b].cut
        self.flush([b for b in self.tails if b in rows and self.feed[b]])  # their rows start an episode now
        feed = [self._tail(self.tails[b]) if b in self.tails else self.feed[b] if b in rows else []
                for b in range(self.B)]
        calls = write_calls(self.model, self.cache, feed, writing, self.sampler.tok.eoc_id,
                            max_call_tokens=self.sampler.max_call_tokens, grammar=self.sampler.grammar,
                            start_states=[ep.call_start for ep in eps], foresight=self.sampler.foresight,
                            **self.decoding)
        for b in [b for b in self.tails if calls.fed_values[b]]:  # fed along with this call
            self.tails.pop(b).values += calls.fed_values[b]
            self.cache.lengths[b] = 0
        actions = []
        for b in rows:
            eps[b].values += calls.fed_values[b]
            self.feed[b] = []
            if writing[b]:
                eps[b].add_call(calls.tokens[b], calls.logp[b], calls.states[b])
                actions.append(self.sampler.tok.decode(calls.tokens[b]))
            else:
                actions.append(self.sampler.filler)
        return actions, [writing[b] for b in rows]

    def absorb(self, b: int, obs: Any, reward: float, done: bool, info: dict, written: bool) -> bool:
        """One env step's result for env ``b``: reward, tool output, and a new episode after a finished one.

        :return: whether a recorded episode finished
        """
        eps = self.sampler.episodes
        assert eps is not None
        ep, max_len = eps[b], self.model.config.max_len
        if written:
            ep.add_reward(reward)
        if not done:
            if written:
                out = self.sampler._tool_ids(ep, str(obs), max_len)
                ep.add_tool(out)
                # the call's tokens not fed yet (at least its last) and the tool output, in one prefill
                self.feed[b] = ep.ids[len(ep.values):] if not ep.cut else []
                ep.call_start = self.sampler.call_start(info)
            return False
        if written:
            ep.add_tool(self.sampler._tool_ids(ep, _terminal_text(info), max_len))
        recorded = self.records(b)
        self.flush([b] if b in self.tails else [])  # an older tail first (its row is about to start over)
        if recorded:
            self.done.append((b, ep, info))
            if self.quota is not None:
                self.quota[b] -= 1
            if self._tail(ep):
                self.tails[b] = ep  # the row keeps its keys until the tail is fed
        eps[b] = new = self.sampler._new_episode(str(obs), self.sampler._reset_info(b))
        if self.records(b):
            self.sampler.check_prompt_fits(new, max_len)
        if b not in self.tails:
            self.cache.lengths[b] = 0  # the row starts over; stale keys are never read
        self.feed[b] = list(new.ids) if self.records(b) else []
        return recorded

    def lockstep(self, max_env_steps: int | None, on_step: StepHook | None) -> None:
        """Every env steps at once (SB3's ``step_async`` / ``step_wait``), deterministic for a seed."""
        venv, steps = self.sampler.venv, 0
        everyone = list(range(self.B))
        while not self.complete and (max_env_steps is None or steps < max_env_steps):
            actions, written = self.write(everyone)
            venv.step_async(actions)  # type: ignore[arg-type]  # text actions: one string per env
            obs, rewards, dones, infos = venv.step_wait()
            steps += self.B
            texts = _texts(obs, self.B)
            recorded = np.array([self.absorb(b, texts[b], float(rewards[b]), bool(dones[b]), infos[b], written[b])
                                 for b in everyone])
            if on_step is not None and on_step(dones, infos, rewards, recorded) is False:
                break

    def asynchronous(self, max_env_steps: int | None, on_step: StepHook | None) -> None:
        """Each env steps as soon as its call is written (``venv.send`` / ``venv.receive``), so envs with
        slow tools do not hold the others back; an env past its quota waits. The order of events depends
        on timing."""
        venv: Any = self.sampler.venv  # has send() / receive() (checked when the sampler was made)
        sent = 0
        busy: dict[int, bool] = {}  # env -> whether its call was written by the policy
        idle = list(range(self.B))
        stop = False
        while True:
            go = [b for b in idle if self.records(b)] if not stop and not self.complete and (
                max_env_steps is None or sent < max_env_steps) else []
            if go:
                actions, written = self.write(go)
                venv.send(go, actions)
                busy.update(zip(go, written))
                sent += len(go)
                idle = [b for b in idle if b not in busy]
            if not busy:
                break
            rows, obs, rewards, dones, infos = venv.receive()
            texts = _texts(obs, len(rows))
            recorded = np.array([self.absorb(b, texts[k], float(rewards[k]), bool(dones[k]), infos[k], busy.pop(b))
                                 for k, b in enumerate(rows)])
            idle += rows
            if on_step is not None and on_step(dones, infos, rewards, recorded) is False:
                stop = True


class _StepBudget:
    """The env steps of one batch, counted across its collections against ``max_env_steps``; each step
    is passed on to ``on_step``, whose False stops the batch.

    :param max_env_steps: the most env steps (None: no limit)
    :param on_step: the caller's step hook, or None
    """

    def __init__(self, max_env_steps: int | None, on_step: StepHook | None):
        self.max_env_steps, self.on_step = max_env_steps, on_step
        self.steps, self.stopped = 0, False

    def __call__(self, dones: np.ndarray, infos: list, rewards: np.ndarray, recorded: np.ndarray) -> bool:
        self.steps += len(dones)
        self.stopped = self.on_step is not None and self.on_step(dones, infos, rewards, recorded) is False
        return not self.stopped

    @property
    def left(self) -> int | None:
        """The steps left (None: no limit)."""
        return None if self.max_env_steps is None else self.max_env_steps - self.steps

    @property
    def spent(self) -> bool:
        """Whether the batch must stop: ``on_step`` said so or the steps are used up."""
        return self.stopped or (self.max_env_steps is not None and self.steps >= self.max_env_steps)


def check_groups(group_size: int, drop_zero_variance_groups: bool, max_resample_rounds: int,
                 asynchronous: bool) -> None:
    """One-line ``ValueError`` for group settings that do not go together.

    :param group_size: G (a positive integer)
    :param drop_zero_variance_groups: dynamic sampling (needs G > 1)
    :param max_resample_rounds: its cap (a non-negative integer)
    :param asynchronous: asynchronous stepping (groups play in lockstep rounds)
    """
    if isinstance(group_size, bool) or not isinstance(group_size, (int, np.integer)) or group_size < 1:
        raise ValueError(f"group_size must be a positive integer, got {group_size!r}")
    if isinstance(max_resample_rounds, bool) or not isinstance(max_resample_rounds, (int, np.integer)) \
            or max_resample_rounds < 0:
        raise ValueError(f"max_resample_rounds must be a non-negative integer, got {max_resample_rounds!r}")
    if drop_zero_variance_groups and group_size < 2:
        raise ValueError("drop_zero_variance_groups needs group_size >= 2 (a group of one episode always has "
                         "zero variance, so every group would be dropped)")
    if group_size > 1 and asynchronous:
        raise ValueError(f"group_size={group_size} plays groups in lockstep rounds: use asynchronous=False "
                         "(async_envs=False)")


def seed_next_reset(venv: VecEnv, seeds: Sequence[int | None]) -> None:
    """Give each env of ``venv`` its own seed for the next ``reset()`` (SB3's ``seed(s)`` gives env
    ``i`` the seed ``s + i``): the innermost vector env's per-env seeds, which every SB3 vector env
    (and :class:`agents.RayVecEnv`) passes to its envs' ``reset(seed=...)`` once and then forgets.

    :param venv: the vector env (wrappers included)
    :param seeds: one seed (or None) per env
    """
    inner = venv.unwrapped
    if not isinstance(getattr(inner, "_seeds", None), list) or len(seeds) != venv.num_envs:
        raise ValueError(f"groups need a vector env that seeds each env's next reset as SB3's VecEnv does "
                         f"(VecEnv.seed); {type(inner).__name__} does not")
    inner._seeds = list(seeds)


def cut_tool_output(out: list[int], room: int) -> list[int]:
    """A tool output's tokens cut to the ``room`` positions left before the next call: its first tokens
    and its last one (the turn marker), or nothing when no room is left.

    :param out: the tool output's tokens (``encode_segment(tokenizer, OWNER_TOOL, text)``)
    :param room: ``max_len`` minus the episode's tokens so far minus ``max_call_tokens``
    """
    if len(out) <= room:
        return out
    return out[: max(room - 1, 0)] + out[-1:] if room > 0 else []


def _texts(obs: Any, n: int) -> list[str]:
    """A vector env's observations -> ``n`` strings."""
    arr = np.asarray(obs, dtype=object).reshape(-1)
    if arr.shape[0] != n:
        raise ValueError(f"expected {n} text observations, got an array of shape {np.shape(obs)}; the token "
                         "sampler needs a vector env of text environments (observation space Text)")
    return [str(o) for o in arr]


def _terminal_text(info: dict) -> str:
    try:
        return info["terminal_observation"]
    except KeyError:
        raise KeyError("a finished episode's info has no 'terminal_observation'; use an SB3 VecEnv "
                       "(DummyVecEnv, SubprocVecEnv, agents.RayVecEnv), which auto-resets and keeps it") from None
