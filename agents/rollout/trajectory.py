"""Token trajectories, collate and their statistics.

Alignment (docs/CONTRACT.md): a trajectory has ``ids [T]`` and ``owner [T]`` (prompt 1, policy 2,
tool 3); everything per predicted token has length ``T-1`` and position ``t`` is about predicting
``ids[t+1]``. ``policy_mask[t] = owner[t+1] == 2``; ``sample_logp[t]`` is the log-prob the sampler
gave ``ids[t+1]``; ``values[t] = V(ids[:t+1])``; an env step's reward sits on the position whose
target is the last token (``<eoc>``) of the call that earned it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np
import torch

from bugfix_gym.contract.tokenizer import Tokenizer
from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, encode_segment
from bugfix_gym.contract.tokens import policy_mask

from agents.decoding.grammar import NO_STATE, CallGrammar


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
    :param group: the episode's group in its batch: episodes of one group shared one reset (its
        seed and options); ``-1``: no group (the episode is a group of its own)
    :param reset_seed: the seed of the reset the episode started from (None: an unseeded reset)
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
    group: int = -1
    reset_seed: int | None = None

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


def group_index(trajs: Sequence[Trajectory]) -> torch.Tensor:
    """Each trajectory's group as ``[B]`` long indices ``0 .. n_groups - 1``, numbered in order of first
    appearance; a trajectory without a group (``group == -1``) is a group of its own."""
    index: dict[tuple[str, int], int] = {}
    out = []
    for i, t in enumerate(trajs):
        key = ("group", t.group) if t.group >= 0 else ("alone", i)
        out.append(index.setdefault(key, len(index)))
    return torch.tensor(out, dtype=torch.long)  # [B]


def same_return(group: Sequence[Trajectory]) -> bool:
    """Whether every episode of a group has the same return (a zero-variance group: a group-relative
    advantage gives it no signal)."""
    return len({float(t.reward) for t in group}) <= 1


#: the statistics of finished episodes, from their final ``info`` dicts and their returns
EpisodeSummary = Callable[[list[dict], list[float]], dict]


def _returns_and_calls(infos: list[dict], rewards: list[float], trajs: Sequence[Trajectory]) -> dict[str, float]:
    """Any text env's summary: the mean return and calls (turns) per episode."""
    calls = [int(((t.owner[1:] == OWNER_POLICY) & (t.owner[:-1] != OWNER_POLICY)).sum()) for t in trajs]
    return dict(reward=sum(rewards) / len(trajs), turns=sum(calls) / len(trajs))


def rollout_stats(trajs: Sequence[Trajectory], summarise: EpisodeSummary | None = None) -> dict[str, float]:
    """Summary of trajectories: ``summarise(infos, rewards)`` (the env's own statistics, e.g. the one
    BugFix-v0 advertises in ``metadata["agent_defaults"]["episode_summary"]``: pass rate, valid calls,
    behaviour), or else ``reward`` and ``turns``; plus ``policy_tokens`` (per episode).

    :param trajs: finished episodes
    :param summarise: the statistics of the episodes' final infos and returns (None: returns and calls)
    """
    if not trajs:
        raise ValueError("rollout_stats needs at least one trajectory")
    infos, rewards = [t.info for t in trajs], [t.reward for t in trajs]
    stats = summarise(infos, rewards) if summarise is not None else _returns_and_calls(infos, rewards, trajs)
    return dict(stats, policy_tokens=sum(float(t.policy_mask.sum()) for t in trajs) / len(trajs))
