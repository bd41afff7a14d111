"""Token-level rollouts: lockstep sampling of many episodes with a KV cache, trajectories, collate.

Alignment (docs/CONTRACT.md): a trajectory has ``ids [T]`` and ``owner [T]`` (prompt 1, policy 2,
tool 3); everything per predicted token has length ``T-1`` and position ``t`` is about predicting
``ids[t+1]``. ``action_mask[t] = owner[t+1] == 2``; ``sample_logp[t]`` is the log-prob the sampler
gave ``ids[t+1]``; ``values[t] = V(ids[:t+1])``; an env step's reward sits on the position whose
target is the last token (``<eoc>``) of the call that earned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from bugfix_gym import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, encode_segment, episode_stats

from .grammar import NO_STATE, CallGrammar, mask_logits
from .model import TinyAgent


@dataclass
class Trajectory:
    """One episode as tokens.

    :param ids: [T] long token ids
    :param owner: [T] long owner codes (prompt 1, policy 2, tool 3)
    :param action_mask: [T-1] float, ``owner[1:] == 2``
    :param sample_logp: [T-1] float, log-prob of each sampled policy token at sampling time (0 off-mask)
    :param values: [T-1] float, critic values ``V(ids[:t+1])`` at sampling time (0 for scripted play)
    :param token_rewards: [T-1] float, each step's reward on the position predicting its call's last token
    :param reward: the episode return (sum of rewards)
    :param info: the final env ``info``
    :param task: the task's name
    :param grammar_state: [T-1] long, the call-grammar state each policy token was sampled under
        (``-1`` where no grammar constrained it: unconstrained sampling, scripted play, non-policy tokens)
    """

    ids: torch.Tensor
    owner: torch.Tensor
    action_mask: torch.Tensor
    sample_logp: torch.Tensor
    values: torch.Tensor
    token_rewards: torch.Tensor
    reward: float
    info: dict = field(default_factory=dict)
    task: str = ""
    grammar_state: torch.Tensor | None = None

    def __len__(self) -> int:
        return int(self.ids.shape[0])


def _trajectory(ids: list[int], owner: list[int], logp: list[float], values: list[float],
                rewards: list[float], info: dict, task: str, states: list[int] | None = None) -> Trajectory:
    """Per-token lists (each entry about the token itself) -> a Trajectory with ``[T-1]`` fields."""
    owner_t = torch.tensor(owner, dtype=torch.long)  # [T]
    return Trajectory(
        ids=torch.tensor(ids, dtype=torch.long),  # [T]
        owner=owner_t,
        action_mask=(owner_t[1:] == OWNER_POLICY).float(),  # [T-1]
        sample_logp=torch.tensor(logp[1:], dtype=torch.float32),  # [T-1] logp of ids[t+1]
        values=torch.tensor(values[:-1], dtype=torch.float32),  # [T-1] V(ids[:t+1])
        token_rewards=torch.tensor(rewards[1:], dtype=torch.float32),  # [T-1] reward of target ids[t+1]
        reward=float(sum(rewards)),
        info=info,
        task=task,
        grammar_state=torch.tensor(states[1:] if states is not None else [NO_STATE] * (len(ids) - 1),
                                   dtype=torch.long),  # [T-1] state under which ids[t+1] was sampled
    )


def _task_name(task: Any) -> str:
    return task if isinstance(task, str) else getattr(task, "name", str(task))


def scripted_rollout(policy: Callable[[str, dict], str], env, task, tok) -> Trajectory:
    """Play one episode of ``task`` with a scripted ``policy(obs, info) -> call`` and tokenize it.

    Policy tokens are the call's words plus ``<eoc>``; ``sample_logp`` and ``values`` are zero.
    """
    obs, info = env.reset(options={"task": task})
    ids = encode_segment(tok, OWNER_PROMPT, obs)
    owner = [OWNER_PROMPT] * len(ids)
    rewards = [0.0] * len(ids)
    done = False
    while not done:
        action = policy(obs, info)
        obs, reward, terminated, truncated, info = env.step(action)
        done = terminated or truncated
        call = encode_segment(tok, OWNER_POLICY, action)
        out = encode_segment(tok, OWNER_TOOL, obs)
        ids += call + out
        owner += [OWNER_POLICY] * len(call) + [OWNER_TOOL] * len(out)
        rewards += [0.0] * (len(call) - 1) + [float(reward)] + [0.0] * len(out)
    zeros = [0.0] * len(ids)
    return _trajectory(ids, owner, zeros, zeros, rewards, info, _task_name(info.get("task", task)))


# (batch, device, dtype, model config) -> (k, v) of the last finished rollout's KV cache, zeroed
# and reused by the next one (fresh zeros of a few MB cost more than the reuse)
_SPARE_KV: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}


@torch.no_grad()
def rollout_batch(model: TinyAgent, envs: Sequence, tasks: Sequence, tok, generator: torch.Generator | None = None,
                  temperature: float = 1.0, max_call_tokens: int = 8,
                  grammar: CallGrammar | None = None) -> list[Trajectory]:
    """Sample one episode per env in lockstep with a KV cache.

    Each model call feeds every row its pending tokens (the prompt, the last sampled token, or a
    finished call's last token plus the tool output), then samples the next policy token for the
    rows that are writing a call. A call ends at ``<eoc>`` or after ``max_call_tokens`` tokens;
    its text (``tok.decode``) goes to the env, which decides validity. An episode ends at env
    termination / truncation, or (``info["stop"] == "max_len"``) when the next turn would not fit
    in the model's ``max_len``.

    :param model: the policy; run in eval mode, under no grad
    :param envs: one env per episode (reset here with ``options={"task": task}``)
    :param tasks: one task (name or Task) per env
    :param tok: the tokenizer
    :param generator: seeds the sampling (same seed, same trajectories)
    :param temperature: sampling temperature; ``sample_logp`` is the log-prob under the sampling
        distribution (at 1.0, the model's own log-prob, so the first PPO ratio is exactly 1)
    :param max_call_tokens: the most tokens one call may have (``<eoc>`` included)
    :param grammar: constrain every call to the legal-call grammar (logits of other tokens masked);
        each policy token's grammar state is kept in ``Trajectory.grammar_state`` so the trainer can
        score the same masked distribution. None: unconstrained sampling
    """
    if len(envs) != len(tasks):
        raise ValueError(f"need one task per env, got {len(envs)} envs and {len(tasks)} tasks")
    if temperature <= 0:
        raise ValueError(f"temperature must be positive, got {temperature}")
    B = len(envs)
    max_len = model.config.max_len
    device = model.tok_emb.weight.device
    was_training = model.training
    model.eval()
    eoc = tok.eoc_id

    ids: list[list[int]] = []
    owner: list[list[int]] = []
    logps: list[list[float]] = []
    values: list[list[float]] = []
    rewards: list[list[float]] = []
    infos: list[dict] = []
    states: list[list[int]] = []  # grammar state each token was sampled under (NO_STATE if none)
    pending: list[list[int]] = []  # tokens each row feeds at the next model call
    for env, task in zip(envs, tasks):
        obs, info = env.reset(options={"task": task})
        prompt = encode_segment(tok, OWNER_PROMPT, obs)
        if len(prompt) + max_call_tokens > max_len:
            raise ValueError(f"prompt of {len(prompt)} tokens leaves no room for a call in max_len={max_len}")
        ids.append(list(prompt))
        owner.append([OWNER_PROMPT] * len(prompt))
        logps.append([0.0] * len(prompt))
        states.append([NO_STATE] * len(prompt))
        rewards.append([0.0] * len(prompt))
        values.append([])
        infos.append(info)
        pending.append(list(prompt))

    writing = [True] * B  # still sampling calls (episode not over)
    call_len = [0] * B
    gstate = [grammar.start if grammar is not None else NO_STATE] * B  # each row's place in its call
    pooled = isinstance(model, TinyAgent)  # reuse the last rollout's KV cache memory
    pool_key = (B, str(device), model.tok_emb.weight.dtype, id(model.config)) if pooled else None
    cache = model.new_cache(B, buffers=_SPARE_KV.pop(pool_key, None)) if pooled else model.new_cache(B)
    while any(pending):
        # one call for every row with pending tokens: the model packs the valid tokens (no
        # padding) and attends per group, so a long prefill does not cost the single-token rows
        n_new = [len(p) for p in pending]
        S = max(n_new)
        rows_ids = [p + [tok.pad_id] * (S - len(p)) for p in pending]
        chunk = torch.tensor(rows_ids, dtype=torch.long, device=device)  # [B, S]
        step_logits, vals = model.extend(chunk, torch.tensor(n_new, device=device), cache)  # [B, V], [B, S]
        logits = step_logits.float()  # idle rows' logits are zero and never sampled
        vals = vals.cpu().tolist()
        for b in range(B):
            if n_new[b]:
                values[b] += vals[b][: n_new[b]]
        fed = [bool(p) for p in pending]
        pending = [[] for _ in range(B)]
        rows = [b for b in range(B) if writing[b] and fed[b]]
        if not rows:
            break
        rows_t = torch.tensor(rows, device=device)
        row_logits = logits[rows_t] / temperature  # [R, V]
        if grammar is not None:
            row_states = torch.tensor([gstate[b] for b in rows], device=device)  # [R]
            row_logits = mask_logits(row_logits, row_states, grammar.allowed)
        logp_all = F.log_softmax(row_logits, dim=-1)  # [R, V]
        new = torch.multinomial(logp_all.exp(), 1, generator=generator)  # [R, 1]
        new_logp = logp_all.gather(-1, new).squeeze(-1).tolist()  # [R]
        for b, t, lp in zip(rows, new.squeeze(-1).tolist(), new_logp):
            ids[b].append(t)
            owner[b].append(OWNER_POLICY)
            logps[b].append(lp)
            states[b].append(gstate[b])
            rewards[b].append(0.0)
            call_len[b] += 1
            if grammar is not None:
                gstate[b] = grammar.step(gstate[b], t)
            if t != eoc and call_len[b] < max_call_tokens:
                pending[b] = [t]
                continue
            if grammar is not None:
                gstate[b] = grammar.start
            # the call is over: the env judges its text
            text = tok.decode(ids[b][len(ids[b]) - call_len[b]:])
            call_len[b] = 0
            obs, reward, terminated, truncated, info = envs[b].step(text)
            rewards[b][-1] = float(reward)
            out = encode_segment(tok, OWNER_TOOL, obs)
            done = terminated or truncated
            room = max_len - len(ids[b]) - len(out)
            if not done and room < max_call_tokens:  # the next turn would not fit: stop here
                done = True
                info = dict(info, stop="max_len")
            out = out[: max(0, max_len - len(ids[b]))]
            infos[b] = info
            writing[b] = not done
            ids[b] += out
            owner[b] += [OWNER_TOOL] * len(out)
            logps[b] += [0.0] * len(out)
            states[b] += [NO_STATE] * len(out)
            rewards[b] += [0.0] * len(out)
            pending[b] = [t] + out  # the call's last token and the tool output, one prefill
    # rows that ended mid-prefill never fed their very last token's value; it is dropped anyway
    trajs = []
    for b in range(B):
        vals_b = values[b] + [0.0] * (len(ids[b]) - len(values[b]))
        trajs.append(_trajectory(ids[b], owner[b], logps[b], vals_b, rewards[b], infos[b],
                                 _task_name(infos[b].get("task", tasks[b])), states[b]))
    if pooled:
        _SPARE_KV.clear()  # keep one spare cache at most
        _SPARE_KV[pool_key] = (cache.k, cache.v)
    model.train(was_training)
    return trajs


def _pad(rows: Sequence[torch.Tensor], length: int, value: float) -> torch.Tensor:
    """Right-pad 1-D tensors to ``length`` -> [B, length]."""
    out = torch.full((len(rows), length), value, dtype=rows[0].dtype)  # [B, length]
    for i, r in enumerate(rows):
        out[i, : r.shape[0]] = r
    return out


def collate(trajs: Sequence[Trajectory], pad_id: int = 0) -> dict[str, torch.Tensor]:
    """Right-pad trajectories into a batch.

    :return: ``ids [B, T]`` (``pad_id``), ``owner [B, T]`` (0 = pad), ``action_mask``, ``sample_logp``,
        ``values``, ``token_rewards`` (all [B, T-1], 0 on padding), ``grammar_state`` ([B, T-1], -1 on
        padding) and ``rewards [B]``
    """
    if not trajs:
        raise ValueError("collate needs at least one trajectory")
    T = max(len(t) for t in trajs)
    return dict(
        ids=_pad([t.ids for t in trajs], T, pad_id),  # [B, T]
        owner=_pad([t.owner for t in trajs], T, 0),  # [B, T]
        action_mask=_pad([t.action_mask for t in trajs], T - 1, 0.0),  # [B, T-1]
        sample_logp=_pad([t.sample_logp for t in trajs], T - 1, 0.0),  # [B, T-1]
        values=_pad([t.values for t in trajs], T - 1, 0.0),  # [B, T-1]
        token_rewards=_pad([t.token_rewards for t in trajs], T - 1, 0.0),  # [B, T-1]
        grammar_state=_pad([t.grammar_state if t.grammar_state is not None
                            else torch.full((len(t) - 1,), NO_STATE, dtype=torch.long) for t in trajs],
                           T - 1, NO_STATE),  # [B, T-1]
        rewards=torch.tensor([t.reward for t in trajs], dtype=torch.float32),  # [B]
    )


def rollout_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Summary of trajectories -> reward, pass_rate, valid_calls, submit_rate, turns, action_tokens
    (the book's keys: :func:`bugfix_gym.episode_stats` plus policy tokens per episode)."""
    stats = episode_stats([t.info for t in trajs], [t.reward for t in trajs])
    keys = ("reward", "pass_rate", "valid_calls", "submit_rate", "turns")
    return dict(**{k: stats[k] for k in keys},
                action_tokens=sum(float(t.action_mask.sum()) for t in trajs) / len(trajs))
