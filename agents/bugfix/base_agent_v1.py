"""The BugFix-v1 base agent: TinyAgent behaviour-cloned on the scripted careful debugger's play, cached on disk.

The debugger (:class:`bugfix_gym.core.scripted_v1.Debugger`) reads, runs the tests, calls ``locate``, then tries
edits on the suspicious lines in the order of ``locate``'s scores times a fixed prior over mutations, tests each,
reverts a failing one and submits after a passing test. It never reads the injected bug or the fixed source, so
the base agent imitates the *shape* of careful debugging and the prior's choice of edits; which edit fits what it
sees is left to RL. Demonstrations are played on **train-split** one-bug tasks only, and tokenized exactly as
:class:`agents.rollout.sampler.EpisodeSampler` tokenizes the episodes it samples (a tool output cut so that the
next call still fits in the context), so the base agent sees at training what it will see when it plays.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import inspect
import json
import random
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from bugfix_gym.contract.tokens import OWNER_POLICY, OWNER_PROMPT, OWNER_TOOL, TokenizerLike, encode_segment
from bugfix_gym.core.env_v1 import BugFixEnvV1
from bugfix_gym.core.scripted_v1 import make_policy
from bugfix_gym.tasks.problems import RepairTask

from agents.algorithms.losses import masked_mean
from agents.bugfix.base_agent import Progress, cache_dir, progress_bar
from agents.bugfix.v1 import tasks_by_problem
from agents.files.checkpoint import load_state_dict_file, save_state_dict_file
from agents.model.tinyagent import TinyAgent, TinyAgentConfig, sequence_log_probs
from agents.rollout.sampler import cut_tool_output
from agents.rollout.trajectory import EpisodeRecord, Trajectory, collate

BASE_V1_FORMAT = "bugfix_gym.base_agent_v1/1"


@dataclasses.dataclass(frozen=True)
class BaseAgentV1Config:
    """How the v1 base agent is made: demonstrations, then behaviour cloning.

    :param demonstrations: debugger episodes played, on train-split one-bug tasks drawn without replacement
        (seeded) from the split's tasks
    :param max_turns: the turn budget of the demonstrations' env (that of training and evaluation)
    :param steps: Adam steps of cross-entropy on the debugger's call tokens
    :param batch_size: episodes per step
    :param lr: Adam learning rate (the peak one with ``cosine``)
    :param weight_decay: AdamW's decoupled weight decay (0: plain Adam)
    :param cosine: decay the learning rate to 0 over ``steps`` on a half cosine (False: constant)
    """

    demonstrations: int = 1000
    max_turns: int = 12
    steps: int = 400
    batch_size: int = 16
    lr: float = 1e-3
    weight_decay: float = 0.0
    cosine: bool = False

    def __post_init__(self) -> None:
        if self.demonstrations < 1 or self.steps < 1 or self.batch_size < 1 or self.max_turns < 1:
            raise ValueError("demonstrations, steps, batch_size and max_turns must be at least 1")
        if not self.lr > 0 or self.weight_decay < 0:
            raise ValueError(f"lr must be positive and weight_decay non-negative, got {self.lr}, {self.weight_decay}")


def demonstration_tasks(n: int, seed: int) -> list[RepairTask]:
    """``n`` train-split one-bug tasks (all of them if ``n`` is larger), drawn with ``seed``, spread over the
    split's functions (a round over every function before a function's second task)."""
    rng = random.Random(seed)
    queues = []
    for group in tasks_by_problem(BugFixEnvV1(split="train", bugs=1).tasks).values():
        rng.shuffle(group)
        queues.append(group)
    out: list[RepairTask] = []
    while len(out) < n and any(queues):
        for q in queues:
            if q and len(out) < n:
                out.append(q.pop())
    return out


def debugger_episode(env: BugFixEnvV1, task: RepairTask, tok: TokenizerLike, max_len: int,
                     max_call_tokens: int) -> Trajectory | None:
    """One episode of the scripted debugger on ``task``, tokenized as the sampler would record it; None when it
    outgrows ``max_len`` (the sampler would cut it; such an episode is left out of the demonstrations)."""
    policy = make_policy("debugger", max_turns=env.max_turns)
    policy.reset(0)
    obs, info = env.reset(options={"task": task})
    ep = EpisodeRecord(encode_segment(tok, OWNER_PROMPT, obs))
    done = False
    while not done:
        call = policy(obs, info, env.legal_calls)
        obs, reward, terminated, truncated, info = env.step(call)
        done = terminated or truncated
        ids = encode_segment(tok, OWNER_POLICY, call)
        if len(ids) > max_call_tokens:
            return None
        ep.add_call(ids)
        ep.add_reward(reward)
        out = encode_segment(tok, OWNER_TOOL, str(obs))
        room = max_len - len(ep.ids) - max_call_tokens  # the sampler's rule, the last output included
        if len(out) > room:
            return None
        ep.add_tool(cut_tool_output(out, room))
    return ep.trajectory(info)


def demonstrations(tok: TokenizerLike, cfg: BaseAgentV1Config, seed: int, max_len: int, max_call_tokens: int,
                   progress: Progress | None = None) -> list[Trajectory]:
    """The debugger's episodes on :func:`demonstration_tasks` (those that fit in ``max_len``)."""
    tasks = demonstration_tasks(cfg.demonstrations, seed)
    env = BugFixEnvV1(split="train", bugs=1, max_turns=cfg.max_turns)
    steps = (progress or _quiet)(len(tasks), "debugger demonstrations")
    episodes = [debugger_episode(env, task, tok, max_len, max_call_tokens) for task, _ in zip(tasks, steps)]
    return [ep for ep in episodes if ep is not None]


def cached_demonstrations(tok: TokenizerLike, cfg: BaseAgentV1Config, max_len: int, max_call_tokens: int,
                          progress: Progress | None = None) -> dict[str, torch.Tensor]:
    """:func:`demonstrations` (drawn with seed 0: every seed's base agent clones the same episodes, in its own
    order) collated (``ids``, ``owner``, ``policy_mask``), cached on disk by a hash of what they depend on."""
    played = dict(demonstrations=cfg.demonstrations, max_turns=cfg.max_turns)  # not the cloning's settings
    key = _key(tok, dict(cfg=played, max_len=max_len, max_call_tokens=max_call_tokens),
               ("demonstration_tasks", "debugger_episode", "demonstrations"))
    path = cache_dir() / f"demonstrations_v1-{key}.pt"
    try:
        data = torch.load(path, weights_only=True)
        if isinstance(data, dict) and {"ids", "owner", "policy_mask"} <= set(data):
            return data
    except FileNotFoundError:
        pass
    except Exception as e:  # noqa: BLE001 - corrupt: played again below
        warnings.warn(f"ignoring unreadable demonstrations cache {path} ({type(e).__name__}: {e})")
    demos = demonstrations(tok, cfg, 0, max_len, max_call_tokens, progress)
    if not demos:
        raise ValueError(f"no debugger demonstration fits in max_len={max_len} tokens: raise max_len")
    full = collate(demos, tok.pad_id)
    data = {k: full[k] for k in ("ids", "owner", "policy_mask")}
    data["rewards"] = full["rewards"]
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(data, tmp)
        tmp.replace(path)
    except OSError as e:
        warnings.warn(f"could not write the demonstrations cache {path}: {e}")
    return data


def make_base_agent_v1(tok: TokenizerLike, model_config: TinyAgentConfig, seed: int, cfg: BaseAgentV1Config,
                       max_call_tokens: int,
                       progress: Progress | None = None,
                       on_step: Callable[[int, TinyAgent, float], None] | None = None) -> TinyAgent:
    """TinyAgent (``model_config``) behaviour-cloned on :func:`demonstrations`: ``cfg.steps`` Adam steps on random
    minibatches of the cross-entropy of the debugger's call tokens. Seeded: the same call returns the same
    weights under the same torch thread count. ``on_step(step, model, loss)`` is called after each step (from 1),
    e.g. to evaluate checkpoints."""
    data = cached_demonstrations(tok, cfg, model_config.max_len, max_call_tokens, progress)
    torch.manual_seed(seed)
    model = TinyAgent(model_config)
    return clone(model, data, cfg, seed, progress, on_step)


def clone(model: TinyAgent, data: dict[str, torch.Tensor], cfg: BaseAgentV1Config, seed: int,
          progress: Progress | None = None,
          on_step: Callable[[int, TinyAgent, float], None] | None = None) -> TinyAgent:
    """``cfg.steps`` optimiser steps of ``model`` (in place) on the cross-entropy of ``data``'s target tokens
    (``ids``, ``owner``, ``policy_mask``: rows drawn at random, ``cfg.batch_size`` a step, with ``seed``)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = (data["owner"] > 0).sum(1)  # [N]
    opt: torch.optim.Optimizer = (torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
                                  if cfg.weight_decay else torch.optim.Adam(model.parameters(), lr=cfg.lr))
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(opt, cfg.steps) if cfg.cosine else None
    for step in (progress or _quiet)(cfg.steps, "behaviour cloning"):
        idx = torch.randint(len(lengths), (cfg.batch_size,), generator=gen)  # [b]
        T = int(lengths[idx].max())  # trim the shared right padding
        logp = sequence_log_probs(model, data["ids"][idx, :T])  # [b, T-1]
        loss = -masked_mean(logp, data["policy_mask"][idx, : T - 1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if schedule is not None:
            schedule.step()
        if on_step is not None:
            on_step(step + 1, model, float(loss.detach()))
    return model


def imitation_scores(model: TinyAgent, episodes: Sequence[Trajectory], tok: TokenizerLike) -> dict[str, float]:
    """How well ``model`` predicts the debugger's calls in ``episodes`` (e.g. played on held-out functions), each
    call's tokens read with the debugger's own play before them (teacher forcing; argmax over the whole vocabulary,
    so a correct argmax is also the grammar's choice):

    * ``nll``: mean negative log-likelihood per call token;
    * ``call_accuracy``: share of calls with every token the argmax;
    * ``site_accuracy``: over the ``edit`` and ``delete`` calls, share whose tokens up to the end of the site
      (``edit L.K`` / ``delete L``) are the argmax: did it pick the line and expression the debugger picked;
    * ``first_edit_accuracy``: the same for each episode's first edit or delete call.
    """
    nll, tokens, calls, right, sites, sites_right, firsts, firsts_right = 0.0, 0, 0, 0, 0, 0, 0, 0
    for ep in episodes:
        with torch.no_grad():
            logits, _ = model(ep.ids[None])  # [1, T, V] (no dropout: train and eval modes agree)
        logp = torch.log_softmax(logits[0, :-1].float(), dim=-1)  # [T-1, V]: logp[t] predicts ids[t+1]
        hit = logp.argmax(-1) == ep.ids[1:]  # [T-1]
        target_logp = logp.gather(-1, ep.ids[1:, None]).squeeze(-1)  # [T-1]
        owner = ep.owner.tolist()
        t, first = 1, True
        while t < len(owner):
            if owner[t] != OWNER_POLICY:
                t += 1
                continue
            end = t
            while end < len(owner) and owner[end] == OWNER_POLICY:
                end += 1
            ids = ep.ids[t:end].tolist()
            ok = hit[t - 1:end - 1].tolist()
            nll -= float(target_logp[t - 1:end - 1].sum())
            tokens += end - t
            calls += 1
            right += all(ok)
            text = tok.decode(ids)
            if text.startswith(("edit ", "delete ")):
                # a token belongs to the site when fewer than two words precede it
                site = [k for k in range(len(ids)) if tok.decode(ids[:k]).count(" ") < 2]
                site_ok = all(ok[k] for k in site)
                sites += 1
                sites_right += site_ok
                if first:
                    firsts += 1
                    firsts_right += site_ok
                    first = False
            t = end
    return dict(nll=nll / max(tokens, 1), call_accuracy=right / max(calls, 1),
                site_accuracy=sites_right / max(sites, 1), first_edit_accuracy=firsts_right / max(firsts, 1),
                calls=calls, edits=sites)


def _quiet(n: int, what: str) -> Iterable[int]:
    return range(n)


#: what the weights depend on besides the arguments: the recipe's source
_RECIPE_FUNCTIONS = ("demonstration_tasks", "debugger_episode", "demonstrations", "cached_demonstrations",
                     "make_base_agent_v1", "clone")
_ENV_MODULES = ("bugfix_gym.core.env_v1", "bugfix_gym.core.locate", "bugfix_gym.core.scripted_v1")
"""The modules whose source the caches' keys include besides the recipe's: the tools' text and the debugger."""


def _key(tok: TokenizerLike, what: dict[str, Any], functions: Sequence[str] = _RECIPE_FUNCTIONS) -> str:
    """16 hex digits of the tokenizer, ``what`` and the source of ``functions``."""
    h = hashlib.sha256()
    h.update(json.dumps({"format": BASE_V1_FORMAT, "tokenizer": tok.to_dict(),
                         **what}, sort_keys=True).encode())
    module = sys.modules[__name__]
    for name in functions:
        h.update(inspect.getsource(getattr(module, name)).encode())
    for env_module in _ENV_MODULES:  # what the debugger does and what the tools print
        h.update(inspect.getsource(importlib.import_module(env_module)).encode())
    return h.hexdigest()[:16]


def _agent_key(tok: TokenizerLike, model_config: TinyAgentConfig, seed: int, cfg: BaseAgentV1Config,
               max_call_tokens: int) -> str:
    return _key(tok, dict(model=dataclasses.asdict(model_config), seed=seed, cfg=dataclasses.asdict(cfg),
                          max_call_tokens=max_call_tokens))


def cached_base_agent_v1(tok: TokenizerLike, model_config: TinyAgentConfig, seed: int, cfg: BaseAgentV1Config,
                         max_call_tokens: int,
                         use_cache: bool = True, verbose: int = 0) -> TinyAgent:
    """:func:`make_base_agent_v1`, cached under :func:`agents.bugfix.base_agent.cache_dir` by a hash of the
    tokenizer, the sizes, the settings and this recipe's source; a corrupt cache file is retrained."""
    path = cache_dir() / f"base_agent_v1-{_agent_key(tok, model_config, seed, cfg, max_call_tokens)}.pt"
    if use_cache and path.exists():
        try:
            agent = load_state_dict_file(path, expected_format=BASE_V1_FORMAT)
            if verbose:
                print(f"base agent loaded from {path}", flush=True)
            return agent
        except Exception as e:  # noqa: BLE001 - corrupt / truncated / stale: retrain below
            warnings.warn(f"ignoring unreadable base-agent cache {path} ({type(e).__name__}: {e}); retraining")
    if verbose:
        print("training the v1 base agent (the scripted debugger's play on train-split functions, then behaviour "
              "cloning; cached afterwards) ...", flush=True)
    rng_state = torch.get_rng_state()
    agent = make_base_agent_v1(tok, model_config, seed, cfg, max_call_tokens, progress_bar if verbose else None)
    torch.set_rng_state(rng_state)
    if use_cache:
        try:
            save_state_dict_file(path, agent, BASE_V1_FORMAT)
        except Exception as e:  # noqa: BLE001 - the cache is an optimisation
            warnings.warn(f"could not write the base-agent cache {path}: {type(e).__name__}: {e}")
    return agent


def cached_path(tok: TokenizerLike, model_config: TinyAgentConfig, seed: int, cfg: BaseAgentV1Config,
                max_call_tokens: int) -> Path:
    """Where :func:`cached_base_agent_v1` keeps these weights."""
    return cache_dir() / f"base_agent_v1-{_agent_key(tok, model_config, seed, cfg, max_call_tokens)}.pt"


__all__: Sequence[str] = ("BaseAgentV1Config", "cached_base_agent_v1", "debugger_episode", "demonstration_tasks",
                          "demonstrations", "clone", "imitation_scores", "make_base_agent_v1")
