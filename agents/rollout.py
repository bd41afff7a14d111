"""Token-level rollouts: one call decoder, one episode sampler, trajectories and collate.

* :func:`write_calls` is the decoder: it writes one call per row of a batch token by token
  with the KV cache (sampled at a temperature, or greedy), optionally constrained to the
  legal-call grammar. The sampler and ``TinyAgentPolicy.predict`` both use it.
* :class:`EpisodeSampler` drives any Stable-Baselines3 ``VecEnv`` of text environments
  through ``step_async(list[str])`` / ``step_wait`` in lockstep, with SB3's auto-reset and
  ``info["terminal_observation"]``, and returns whole episodes as :class:`Trajectory`.
  Its tokens come only from what the env returns (the reset observation is the prompt,
  every step's observation the tool output) and from the policy's own calls.

Alignment (docs/CONTRACT.md): a trajectory has ``ids [T]`` and ``owner [T]`` (prompt 1, policy 2,
tool 3); everything per predicted token has length ``T-1`` and position ``t`` is about predicting
``ids[t+1]``. ``policy_mask[t] = owner[t+1] == 2``; ``sample_logp[t]`` is the log-prob the sampler
gave ``ids[t+1]``; ``values[t] = V(ids[:t+1])``; an env step's reward sits on the position whose
target is the last token (``<eoc>``) of the call that earned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from stable_baselines3.common.vec_env import DummyVecEnv, VecEnv

from bugfix_gym import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, BugFixEnv, Tokenizer, encode_segment, episode_stats
from bugfix_gym.tokens import policy_mask

from .grammar import NO_STATE, CallGrammar
from .model import KVCache, TinyAgent


@dataclass
class Trajectory:
    """One episode as tokens.

    :param ids: [T] long token ids
    :param owner: [T] long owner codes (prompt 1, policy 2, tool 3)
    :param policy_mask: [T-1] float, ``owner[1:] == 2``: the positions whose target the policy wrote
    :param sample_logp: [T-1] float, log-prob of each sampled policy token at sampling time (0 off-mask)
    :param values: [T-1] float, critic values ``V(ids[:t+1])`` at sampling time; 0 for scripted play and
        after the last call (the final tool output is never fed to the model)
    :param token_rewards: [T-1] float, each step's reward on the position predicting its call's last token
    :param reward: the episode return (sum of rewards)
    :param info: the env's ``info`` of the episode's last step
    :param task: the task's name (``info["task"]`` when the env gives one)
    :param grammar_state: [T-1] long, the call-grammar state each policy token was sampled in
        (``-1`` off the mask or when no grammar was used)
    """

    ids: torch.Tensor
    owner: torch.Tensor
    policy_mask: torch.Tensor
    sample_logp: torch.Tensor
    values: torch.Tensor
    token_rewards: torch.Tensor
    reward: float
    info: dict = field(default_factory=dict)
    task: str = ""
    grammar_state: torch.Tensor | None = None

    def __post_init__(self):
        if self.grammar_state is None:
            self.grammar_state = torch.full((max(len(self) - 1, 0),), NO_STATE, dtype=torch.long)

    def __len__(self) -> int:
        return int(self.ids.shape[0])


class EpisodeRecord:
    """An episode's tokens as they are produced, each entry about the token itself.

    ``values`` holds one critic value per token fed to the model so far (it can lag behind
    ``ids`` by the tokens not fed yet).
    """

    __slots__ = ("ids", "owner", "logp", "values", "rewards", "states", "cut", "call_start")

    def __init__(self, prompt_ids: Sequence[int]):
        n = len(prompt_ids)
        self.ids: list[int] = list(prompt_ids)
        self.owner: list[int] = [OWNER_PROMPT] * n
        self.logp: list[float] = [0.0] * n
        self.rewards: list[float] = [0.0] * n
        self.states: list[int] = [NO_STATE] * n
        self.values: list[float] = []
        self.cut = False  # the episode outgrew the model's context: later turns are not recorded
        self.call_start = CallGrammar.start  # the grammar state its next call starts in

    def add_call(self, ids: Sequence[int], logp: Sequence[float] | None = None,
                 states: Sequence[int] | None = None) -> None:
        self.ids += ids
        self.owner += [OWNER_POLICY] * len(ids)
        self.logp += logp if logp is not None else [0.0] * len(ids)
        self.states += states if states is not None else [NO_STATE] * len(ids)
        self.rewards += [0.0] * len(ids)

    def add_reward(self, reward: float) -> None:
        """A step's reward, on the last token of the call that earned it."""
        self.rewards[len(self.rewards) - 1 - self.owner[::-1].index(OWNER_POLICY)] += float(reward)

    def add_tool(self, ids: Sequence[int]) -> None:
        self.ids += ids
        self.owner += [OWNER_TOOL] * len(ids)
        self.logp += [0.0] * len(ids)
        self.states += [NO_STATE] * len(ids)
        self.rewards += [0.0] * len(ids)

    def trajectory(self, info: dict) -> Trajectory:
        """The finished episode, per-token fields shifted to the ``[T-1]`` target alignment."""
        owner = torch.tensor(self.owner, dtype=torch.long)  # [T]
        values = self.values[: len(self.ids)] + [0.0] * (len(self.ids) - len(self.values))
        info = dict(info)
        if self.cut:
            info["context_cut"] = True
        return Trajectory(
            ids=torch.tensor(self.ids, dtype=torch.long),  # [T]
            owner=owner,
            policy_mask=torch.from_numpy(policy_mask(np.asarray(self.owner))),  # [T-1]
            sample_logp=torch.tensor(self.logp[1:], dtype=torch.float32),  # [T-1] logp of ids[t+1]
            values=torch.tensor(values[:-1], dtype=torch.float32),  # [T-1] V(ids[:t+1])
            token_rewards=torch.tensor(self.rewards[1:], dtype=torch.float32),  # [T-1] reward of target ids[t+1]
            reward=float(sum(self.rewards)),
            info=info,
            task=str(info.get("task", "")),
            grammar_state=torch.tensor(self.states[1:], dtype=torch.long),  # [T-1]
        )


# ---------------------------------------------------------------------- the decoder
class Foresight:
    """Before the policy picks an edit's op, close the ops its own model expects to answer ``no change``.

    When a call has been written up to ``edit``, the model reads each open op's continuation
    (``op <eoc>``) and predicts the first word of the tool's answer (:meth:`TinyAgent.peek`). Ops
    whose ``no`` has probability above ``threshold`` are closed for this call, as a call mask
    closes calls (:meth:`CallGrammar.start_for`): the recorded grammar state carries them, so the
    trainer scores the op with the same mask. If every open op would close, the one least
    expected to change nothing stays open. The prediction is the agent's own: it comes from
    what the model learnt of the edits' answers (``TokenPPO(tool_coef=...)``), nothing else.

    :param grammar: the call grammar, with calls ``edit <op>``
    :param tokenizer: the policy's tokenizer (knows ``edit`` and ``no``)
    :param threshold: the probability of ``no change`` above which an op is closed, in (0, 1]
    """

    def __init__(self, grammar: CallGrammar, tokenizer: Tokenizer, threshold: float):
        if not 0.0 < threshold <= 1.0:
            raise ValueError(f"the foresight threshold must be in (0, 1], got {threshold}")
        edit, self.no_id = tokenizer.ids.get("edit"), tokenizer.ids.get("no")
        ops = [(k, tokenizer.encode(c)) for k, c in enumerate(grammar.calls) if c.split()[0] == "edit"]
        if edit is None or self.no_id is None or not ops or any(len(ids) != 2 for _, ids in ops):
            raise ValueError("foresight needs a grammar with calls 'edit <op>' and a tokenizer that knows 'edit' "
                             "and 'no'")
        self.grammar, self.threshold = grammar, float(threshold)
        self.node = grammar.step(grammar.start, edit)  # the state after "edit": the op comes next
        self.calls = [k for k, _ in ops]  # grammar call index of each op
        self.ops = torch.tensor([ids[1] for _, ids in ops])  # [K] op token ids
        self.continuations = torch.stack([self.ops, torch.full_like(self.ops, tokenizer.eoc_id)], dim=-1)  # [K, 2]

    def refine(self, model: TinyAgent, cache: KVCache, rows: list[int], state: list[int]) -> None:
        """Close, in ``state`` (per row, in place), the ops expected to answer ``no change`` for the
        ``rows`` whose call stands at the op; their cache holds the call so far."""
        g = self.grammar
        at = [b for b in rows if state[b] >= 0 and g.node(state[b]) == self.node]
        if not at:
            return
        device = model.tok_emb.weight.device
        cont = self.continuations.to(device).expand(len(at), *self.continuations.shape)  # [R, K, 2] "op <eoc>"
        logits = model.peek(torch.tensor(at, device=device), cont, cache)  # [R, K, V]
        p_no = torch.softmax(logits.float(), dim=-1)[..., self.no_id].tolist()  # [R][K]
        for b, p in zip(at, p_no):
            open_k = [i for i, k in enumerate(self.calls) if g.is_open(state[b], k)]
            shut = [i for i in open_k if p[i] > self.threshold]
            if open_k and len(shut) == len(open_k):
                shut.remove(min(open_k, key=lambda i: p[i]))
            state[b] = g.close(state[b], [self.calls[i] for i in shut])


@dataclass
class Calls:
    """What :func:`write_calls` wrote: per row the call's tokens, their log-probs and grammar states,
    and the critic value of every token fed to the model (in feeding order)."""

    tokens: list[list[int]]
    logp: list[list[float]]
    states: list[list[int]]
    fed_values: list[list[float]]


@torch.no_grad()
def write_calls(model: TinyAgent, cache: KVCache, feed: list[list[int]], writing: Sequence[bool], eoc_id: int, *,
                max_call_tokens: int = 8, grammar: CallGrammar | None = None, temperature: float = 1.0,
                deterministic: bool = False, generator: torch.Generator | None = None,
                start_states: Sequence[int] | None = None, foresight: Foresight | None = None) -> Calls:
    """Write one call for each row with ``writing[b]``, token by token with the KV cache.

    Every model call feeds each row its pending tokens (first ``feed[b]``: the prompt, or a
    finished call's last token and the tool output; then the last sampled token) and samples the
    next token of the rows still writing. A call ends at ``<eoc>`` or after ``max_call_tokens``
    tokens; its last token is *not* fed here (the next turn feeds it with the tool output).

    :param model: the policy (eval mode, no grad)
    :param cache: the rows' KV cache; ``feed`` continues each row where the cache ends
    :param feed: per row, tokens to feed before writing (may be empty)
    :param writing: per row, whether it writes a call now
    :param eoc_id: the end-of-call token
    :param max_call_tokens: the most tokens one call may have (``<eoc>`` included)
    :param grammar: mask the logits to the legal calls (None: any token)
    :param temperature: sampling temperature; ``logp`` is the log-prob under the sampled distribution
    :param deterministic: greedy decoding instead of sampling
    :param generator: seeds the sampling
    :param start_states: per row, the grammar state its call starts in (default: the grammar's start;
        :meth:`agents.grammar.CallGrammar.start_for` makes the state of a call mask)
    :param foresight: with a grammar, close the edit ops the model expects to answer ``no change``
        (:class:`Foresight`) before it picks one
    """
    B = len(feed)
    device = model.tok_emb.weight.device
    out = Calls([[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)], [[] for _ in range(B)])
    if grammar is None:
        state = [NO_STATE] * B
    else:
        state = list(start_states) if start_states is not None else [grammar.start] * B
    active = [b for b in range(B) if writing[b]]
    pending = [list(f) for f in feed]
    while any(pending):
        n_new = [len(p) for p in pending]
        S = max(n_new)
        chunk = torch.tensor([p + [0] * (S - len(p)) for p in pending], dtype=torch.long, device=device)  # [B, S]
        logits, values = model.extend(chunk, torch.tensor(n_new, device=device), cache)  # [B, V], [B, S]
        fed = values.cpu().tolist()
        for b in range(B):
            out.fed_values[b] += fed[b][: n_new[b]]
        rows = [b for b in active if n_new[b]]  # a writing row always has something to feed
        pending = [[] for _ in range(B)]
        if not rows:
            break
        rows_t = torch.tensor(rows, device=device)
        step_logits = logits[rows_t].float() / temperature  # [R, V]
        if foresight is not None and grammar is not None:
            foresight.refine(model, cache, rows, state)
        if grammar is not None:
            step_logits = grammar.mask_logits(step_logits, torch.tensor([state[b] for b in rows], device=device))
        logp_all = F.log_softmax(step_logits, dim=-1)  # [R, V]
        new = logp_all.argmax(-1, keepdim=True) if deterministic else sample_tokens(logp_all.exp(), generator)  # [R, 1]
        new_logp = logp_all.gather(-1, new).squeeze(-1).tolist()  # [R]
        still = []
        for b, t, lp in zip(rows, new.squeeze(-1).tolist(), new_logp):
            out.tokens[b].append(t)
            out.logp[b].append(lp)
            out.states[b].append(state[b])
            if grammar is not None:
                state[b] = grammar.step(state[b], t)
            if t != eoc_id and len(out.tokens[b]) < max_call_tokens:
                pending[b] = [t]
                still.append(b)
        active = still
    return out


def sample_tokens(probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of ``probs`` [R, V] -> ids [R, 1], by inverting the cumulative distribution
    (cheaper than ``torch.multinomial`` on a CPU). A token of probability zero
    is never drawn."""
    cdf = probs.double().cumsum(-1)  # [R, V]
    u = torch.rand(probs.shape[0], 1, generator=generator, dtype=torch.float64) * cdf[:, -1:]  # [R, 1] in [0, total)
    new = torch.searchsorted(cdf, u, right=True).clamp(max=probs.shape[1] - 1)  # first i with cdf[i] > u
    zero = probs.gather(-1, new) == 0  # only if rounding put u at the very top
    return torch.where(zero, probs.argmax(-1, keepdim=True), new)


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
    :param tokenizer: the policy's tokenizer (unknown words become ``<unk>``)
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
    """

    def __init__(self, venv: VecEnv, tokenizer: Tokenizer, max_call_tokens: int = 8,
                 grammar: CallGrammar | None = None, filler: str = "", asynchronous: bool = False,
                 call_mask_key: str | None = None, foresight: Foresight | None = None):
        if asynchronous and not (hasattr(venv, "send") and hasattr(venv, "receive")):
            raise ValueError(f"asynchronous stepping needs a vector env with send() / receive() (e.g. "
                             f"agents.RayVecEnv); {type(venv).__name__} steps all envs in lockstep only")
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
        return self.grammar.start_for([bool(x) for x in info[self.call_mask_key]])

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
        at length 0 and the stale keys and values beyond a row's length are never attended to."""
        cache = self._cache
        if cache is None or type(model) is not self._cache_model_type \
                or cache.k.shape[:3] != (model.config.n_layer, self.venv.num_envs, model.config.n_head) \
                or cache.k.dtype != model.tok_emb.weight.dtype or cache.max_len != model.config.max_len:
            cache = self._cache = model.new_cache(self.venv.num_envs)  # a subclass may keep another kind of cache
            self._cache_model_type = type(model)
        cache.lengths.zero_()
        return cache

    def _new_episode(self, prompt: Any, info: dict) -> EpisodeRecord:
        ep = EpisodeRecord(encode_segment(self.tok, OWNER_PROMPT, str(prompt)))
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
        if fresh and not self.asynchronous and n_episodes > B > 1:  # one env never waits: no rounds needed
            return self._rounds(model, -(-n_episodes // B), max_env_steps, on_step, decoding)
        if fresh or self.episodes is None:
            self.restart()
        quota = [-(-n_episodes // B)] * B if fresh else None
        run = self._run(model, quota, n_episodes, max_env_steps=max_env_steps, on_step=on_step, decoding=decoding)
        if fresh:
            self.episodes = None  # the episodes in progress are not part of any batch: start over next time
        return [traj for _, traj in run.finished]

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
        out: list[Trajectory] = []
        steps, stopped = 0, False

        def counting(dones: np.ndarray, infos: list, rewards: np.ndarray, recorded: np.ndarray) -> bool:
            nonlocal steps, stopped
            steps += len(dones)
            stopped = on_step is not None and on_step(dones, infos, rewards, recorded) is False
            return not stopped

        for _ in range(rounds):
            if stopped or (max_env_steps is not None and steps >= max_env_steps):
                break
            self.restart()
            run = self._run(model, [1] * B, B,
                            max_env_steps=None if max_env_steps is None else max_env_steps - steps,
                            on_step=counting, decoding=decoding)
            out += [traj for _, traj in run.finished]
        self.episodes = None
        return out

    def _run(self, model: TinyAgent, quota: list[int] | None, n_episodes: int,
             max_env_steps: int | None, on_step: StepHook | None, decoding: dict[str, Any]) -> "_Run":
        run = _Run(self, model, quota, n_episodes, decoding)
        was_training = model.training
        model.eval()
        try:
            if self.asynchronous:
                run.asynchronous(max_env_steps, on_step)
            else:
                run.lockstep(max_env_steps, on_step)
        finally:
            model.train(was_training)
        return run

    def _tool_ids(self, ep: EpisodeRecord, text: str, max_len: int) -> list[int]:
        """The tool output's tokens, cut so that the next call still fits in the context
        (its last token, the turn marker, is kept); marks the episode cut when nothing fits."""
        out = encode_segment(self.tok, OWNER_TOOL, str(text))
        room = max_len - len(ep.ids) - self.max_call_tokens
        if len(out) > room:
            out = out[: max(room - 1, 0)] + out[-1:] if room > 0 else []
        if room <= 0:
            ep.cut = True
        return out

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
            run = self._run(model, [1] * len(chunk) + [0] * (B - len(chunk)), len(chunk), max_env_steps=None,
                            on_step=None, decoding=decoding)
            by_row = dict(run.finished)  # each recorded env finishes exactly one episode
            out += [by_row[b] for b in range(len(chunk))]
        self.episodes = None  # the waiting envs' episodes were not recorded: start over next time
        return out


class _Run:
    """One collection: the KV cache, what each env feeds next, how many episodes each env still records,
    and the finished episodes.

    :param quota: per env, how many of its next episodes to record (None: all of them, until
        ``n_episodes`` have finished); an env past its quota sends the sampler's ``filler`` call
    """

    def __init__(self, sampler: EpisodeSampler, model: TinyAgent, quota: list[int] | None, n_episodes: int,
                 decoding: dict[str, Any]):
        assert sampler.episodes is not None
        self.s, self.model, self.decoding = sampler, model, decoding
        self.B = sampler.venv.num_envs
        self.quota = list(quota) if quota is not None else None
        self.target = sum(quota) if quota is not None else n_episodes
        self.cache = sampler._cache_for(model)
        self.finished: list[tuple[int, Trajectory]] = []
        self.feed: list[list[int]] = []
        for b, ep in enumerate(sampler.episodes):  # a new cache: re-read the episodes in progress
            ep.values = []  # with the current weights
            self.feed.append(list(ep.ids) if self.records(b) and not ep.cut else [])

    def records(self, b: int) -> bool:
        """Whether env ``b`` still records episodes (its calls come from the policy, else the filler)."""
        return self.quota is None or self.quota[b] > 0

    @property
    def complete(self) -> bool:
        return len(self.finished) >= self.target

    def write(self, rows: Sequence[int]) -> tuple[list[str], list[bool]]:
        """Write the calls of ``rows`` (one model pass per token, those rows only): their actions, and
        whether each was written by the policy (else it is the filler)."""
        eps = self.s.episodes
        assert eps is not None
        writing = [False] * self.B
        for b in rows:
            writing[b] = self.records(b) and not eps[b].cut
        feed = [self.feed[b] if b in rows else [] for b in range(self.B)]
        calls = write_calls(self.model, self.cache, feed, writing, self.s.tok.eoc_id,
                            max_call_tokens=self.s.max_call_tokens, grammar=self.s.grammar,
                            start_states=[ep.call_start for ep in eps], foresight=self.s.foresight,
                            **self.decoding)
        actions = []
        for b in rows:
            eps[b].values += calls.fed_values[b]
            self.feed[b] = []
            if writing[b]:
                eps[b].add_call(calls.tokens[b], calls.logp[b], calls.states[b])
                actions.append(self.s.tok.decode(calls.tokens[b]))
            else:
                actions.append(self.s.filler)
        return actions, [writing[b] for b in rows]

    def absorb(self, b: int, obs: Any, reward: float, done: bool, info: dict, written: bool) -> bool:
        """One env step's result for env ``b``: reward, tool output, and a new episode after a finished one.

        :return: whether a recorded episode finished
        """
        eps = self.s.episodes
        assert eps is not None
        ep, max_len = eps[b], self.model.config.max_len
        if written:
            ep.add_reward(reward)
        if not done:
            if written:
                out = self.s._tool_ids(ep, str(obs), max_len)
                ep.add_tool(out)
                # the call's last token (not fed yet) and the tool output, in one prefill
                self.feed[b] = [ep.ids[len(ep.ids) - len(out) - 1]] + out if not ep.cut else []
                ep.call_start = self.s.call_start(info)
            return False
        if written:
            ep.add_tool(self.s._tool_ids(ep, _terminal_text(info), max_len))
        recorded = self.records(b)
        if recorded:
            self.finished.append((b, ep.trajectory(info)))
            if self.quota is not None:
                self.quota[b] -= 1
        eps[b] = new = self.s._new_episode(str(obs), self.s._reset_info(b))
        self.cache.lengths[b] = 0  # the row starts over; stale keys are never read
        self.feed[b] = list(new.ids) if self.records(b) else []
        return recorded

    def lockstep(self, max_env_steps: int | None, on_step: StepHook | None) -> None:
        """Every env steps at once (SB3's ``step_async`` / ``step_wait``), deterministic for a seed."""
        venv, steps = self.s.venv, 0
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
        venv: Any = self.s.venv  # has send() / receive() (checked when the sampler was made)
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


# ---------------------------------------------------------------------- task lists and statistics
def task_vec_env(n_envs: int, **env_kwargs) -> DummyVecEnv:
    """A ``DummyVecEnv`` of ``n_envs`` BugFix-v0 envs (for playing given tasks)."""
    return DummyVecEnv([lambda: BugFixEnv(**env_kwargs) for _ in range(n_envs)])


def sample_episodes(model: TinyAgent, tokenizer: Tokenizer, tasks: Sequence[Any], n_per_task: int = 1,
                    seed: int = 0, env_kwargs: dict | None = None, max_envs: int = 64,
                    **sampler_kwargs) -> list[Trajectory]:
    """``n_per_task`` episodes of each task (names or Task objects) on BugFix-v0, seeded, in task order.

    :param model: the policy
    :param tokenizer: its tokenizer
    :param tasks: the tasks to play
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param env_kwargs: BugFix-v0 options (e.g. ``call_cost``)
    :param max_envs: the most envs stepped in lockstep
    :param sampler_kwargs: :class:`EpisodeSampler` arguments (``max_call_tokens``, ``grammar``) and
        ``temperature`` / ``deterministic``
    """
    batch = [t for t in tasks for _ in range(n_per_task)]
    if not batch:
        return []
    play = {k: sampler_kwargs.pop(k) for k in ("temperature", "deterministic") if k in sampler_kwargs}
    sampler = EpisodeSampler(task_vec_env(min(max_envs, len(batch)), **(env_kwargs or {})), tokenizer,
                             **sampler_kwargs)
    return sampler.play_tasks(model, batch, generator=torch.Generator().manual_seed(seed), **play)


def evaluate(model: TinyAgent, tokenizer: Tokenizer, tasks: Sequence[Any], n_per_task: int = 1, seed: int = 0,
             **kwargs: Any) -> dict[str, float]:
    """The evaluator: :func:`sample_episodes` of the tasks, summarised by :func:`bugfix_gym.episode_stats`
    (pass rate, valid calls, behaviour, and ``first_edit_right`` from each task's answer).

    :param model: the policy
    :param tokenizer: its tokenizer
    :param tasks: Task objects (or names of registered tasks)
    :param n_per_task: episodes per task
    :param seed: seeds the sampling
    :param kwargs: more :func:`sample_episodes` arguments (``env_kwargs``, ``grammar``, ``temperature``, ...)
    """
    from bugfix_gym import get_task

    tasks = [get_task(t) for t in tasks]
    trajs = sample_episodes(model, tokenizer, tasks, n_per_task, seed, **kwargs)
    fix_ops = [t.fix_op for t in tasks for _ in range(n_per_task)]
    return dict(episode_stats([t.info for t in trajs], [t.reward for t in trajs], fix_ops),
                policy_tokens=sum(float(t.policy_mask.sum()) for t in trajs) / len(trajs))


def scripted_rollout(policy: Callable[[str, dict], str], env, task, tok: Tokenizer) -> Trajectory:
    """Play one episode of ``task`` with a scripted ``policy(obs, info) -> call`` and tokenize it the
    way the sampler does (``sample_logp`` and ``values`` are zero)."""
    obs, info = env.reset(options={"task": task})
    ep = EpisodeRecord(encode_segment(tok, OWNER_PROMPT, obs))
    done = False
    while not done:
        action = policy(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        ep.add_call(encode_segment(tok, OWNER_POLICY, action))
        ep.add_reward(reward)
        ep.add_tool(encode_segment(tok, OWNER_TOOL, obs))
    return ep.trajectory(info)


def _pad(rows: Sequence[torch.Tensor], length: int, value: float) -> torch.Tensor:
    """Right-pad 1-D tensors to ``length`` -> [B, length]."""
    out = torch.full((len(rows), length), value, dtype=rows[0].dtype)  # [B, length]
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def collate(trajs: Sequence[Trajectory], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad trajectories into a batch.

    :return: ``ids [B, T]`` (``pad_id``), ``owner [B, T]`` (0 = pad), ``policy_mask``, ``sample_logp``,
        ``values``, ``token_rewards`` (all [B, T-1], 0 on padding), ``grammar_state`` [B, T-1] (-1 on
        padding) and ``rewards [B]``
    """
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    T = max(len(t) for t in trajs)
    return dict(
        ids=_pad([t.ids for t in trajs], T, pad_id),  # [B, T]
        owner=_pad([t.owner for t in trajs], T, 0),  # [B, T]
        policy_mask=_pad([t.policy_mask for t in trajs], T - 1, 0.0),  # [B, T-1]
        sample_logp=_pad([t.sample_logp for t in trajs], T - 1, 0.0),  # [B, T-1]
        values=_pad([t.values for t in trajs], T - 1, 0.0),  # [B, T-1]
        token_rewards=_pad([t.token_rewards for t in trajs], T - 1, 0.0),  # [B, T-1]
        grammar_state=_pad([t.grammar_state for t in trajs], T - 1, NO_STATE),  # type: ignore[misc]  # [B, T-1]
        rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32),  # [B]
    )


def rollout_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Summary of trajectories: the BugFix statistics of :func:`bugfix_gym.episode_stats` (when the
    env's ``info`` has them) plus ``reward``, ``turns`` and ``policy_tokens`` (per episode)."""
    if not trajs:
        raise ValueError("rollout_stats needs at least one trajectory")
    n = len(trajs)
    tokens = sum(float(t.policy_mask.sum()) for t in trajs) / n
    infos = [t.info for t in trajs]
    if all("submitted" in i and "n_turns" in i for i in infos):
        stats = episode_stats(infos, [t.reward for t in trajs])
    else:  # another text env: returns and calls per episode
        calls = [int(((t.owner[1:] == OWNER_POLICY) & (t.owner[:-1] != OWNER_POLICY)).sum()) for t in trajs]
        stats = dict(reward=sum(t.reward for t in trajs) / n, turns=sum(calls) / n)
    return dict(stats, policy_tokens=tokens)
