"""The base agent: TinyAgent behaviour-cloned on well-formed but unskilled scripted play, cached on disk.

It is the book's stand-in for a pretrained base model (§6.2): it writes valid calls ~98% of
the time and submits most episodes, but passes only when a guessed fix happens to be right.
"""

from __future__ import annotations

import dataclasses
import hashlib
import inspect
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable, Iterable, Sequence

import torch

from bugfix_gym import Task, Tokenizer, make_tasks, scripted_policy
from bugfix_gym.views.text_wrappers import make_bugfix_env

from agents.algorithms.losses import masked_mean, tool_output_mask
from agents.files.checkpoint import load_state_dict_file, save_state_dict_file
from agents.model.tinyagent import TinyAgent, TinyAgentConfig, sequence_log_probs
from agents.bugfix.practice import EditPractice
from agents.rollout.trajectory import collate, scripted_rollout


def make_base_agent(tok: Tokenizer, seed: int = 0, kinds: Sequence[str] = ("random", "blind"),
                    episodes_per_task: int = 8, steps: int = 200, batch_size: int = 64, lr: float = 3e-3,
                    config: TinyAgentConfig | None = None, tasks: Sequence[Task] | None = None,
                    teacher_kwargs: dict[str, dict[str, Any]] | None = None,
                    env_kwargs: dict[str, Any] | None = None, tool_coef: float = 0.0,
                    tool_calls: Sequence[str] | None = None, practice: int = 0,
                    practice_tasks: str = "generated", practice_steps: int = 0, practice_batch_size: int = 64,
                    practice_lr: float = 1e-3, progress: Progress | None = None) -> TinyAgent:
    """TinyAgent behaviour-cloned on scripted play over the train tasks (book §6.2).

    Collects ``episodes_per_task`` demonstrations per train task from each scripted policy in
    ``kinds``, then takes ``steps`` Adam steps on random minibatches of cross-entropy over
    policy tokens (plus, with ``tool_coef``, over the tool outputs: the agent also learns to predict
    what the tools will answer, from the episodes it watched). Everything is seeded: the same call
    returns the same weights (bit for bit under the same ``torch.get_num_threads()``; float
    reductions differ between thread counts).

    :param tok: the tokenizer (``bugfix_gym.build_tokenizer()``)
    :param seed: seeds the model init, the scripted policies and the minibatches
    :param kinds: scripted policies to imitate
    :param episodes_per_task: demonstrations per train task and kind
    :param steps: Adam steps (the book's 200; with the ``<turn>`` marker that is enough, docs/chapter6.md)
    :param batch_size: episodes per minibatch
    :param lr: Adam learning rate
    :param config: model sizes (default: ``TinyAgentConfig(vocab_size=tok.vocab_size)``)
    :param tasks: the tasks the scripted policies play (default: the book's 20 train tasks)
    :param teacher_kwargs: extra ``scripted_policy`` arguments per kind, e.g. ``{"careful": {"p_read": 1.0}}``
    :param env_kwargs: BugFix-v0 options of the env the demonstrations are played in (e.g. ``hide_outputs``)
    :param tool_coef: weight of the cross-entropy on tool-output tokens (0: policy tokens only, the book's)
    :param tool_calls: with ``tool_coef``, only the outputs of these calls (e.g. ``["edit"]``); None: all
    :param practice: this many edit-practice transcripts (:class:`agents.bugfix.practice.EditPractice`,
        recombined train code) to learn the edits' answers on: first alone, for ``practice_steps``
        steps, then along with behaviour cloning (a minibatch of ``batch_size`` per step)
    :param practice_tasks: whose code the practice recombines: ``"generated"`` or ``"book"`` train code
    :param practice_steps: Adam steps on the practice transcripts' answers alone, before behaviour cloning
    :param practice_batch_size: practice transcripts per step of those
    :param practice_lr: learning rate of those steps (their own optimizer)
    :param progress: ``progress(n, what)`` -> the iterable of the ``n`` steps of ``what`` (e.g. a progress
        bar, :func:`progress_bar`); None: a plain ``range``. It cannot change the weights.
    """
    if bool(practice) != bool(practice_steps):
        raise ValueError(f"edit practice needs both practice (transcripts) and practice_steps, got {practice} and "
                         f"{practice_steps}")
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    steps_of = progress or _quiet
    tasks = make_tasks("train") if tasks is None else list(tasks)
    data = _demonstrations(tok, tasks, kinds, episodes_per_task, seed, teacher_kwargs, env_kwargs)
    if tool_coef:
        call_ids = None if tool_calls is None else [tok.ids[c] for c in tool_calls]
        data["tool_mask"] = tool_output_mask(data["ids"], data["owner"], call_ids)  # [N, T-1] targets the tools wrote
    model = TinyAgent(config or TinyAgentConfig(vocab_size=tok.vocab_size))
    edit_practice = EditPractice(tok, practice, seed=seed, tasks=practice_tasks) if practice else None
    if edit_practice is not None:  # what the edit ops do, learned before how to play
        _practise_edits(model, edit_practice, steps_of(practice_steps, "edit practice"), practice_batch_size,
                        practice_lr)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in steps_of(steps, "behaviour cloning"):
        idx = torch.randint(len(data["ids"]), (batch_size,), generator=gen)  # [b]
        loss = _cloning_loss(model, data, idx, tool_coef)
        if edit_practice is not None:
            loss = loss + edit_practice.loss(model, batch_size)  # and kept while it learns to play
        _adam_step(opt, loss)
    return model


def _demonstrations(tok: Tokenizer, tasks: list[Task], kinds: Sequence[str], episodes_per_task: int, seed: int,
                    teacher_kwargs: dict[str, dict[str, Any]] | None, env_kwargs: dict[str, Any] | None
                    ) -> dict[str, torch.Tensor]:
    """``episodes_per_task`` episodes of each task by each scripted policy in ``kinds`` (the ``k``-th
    seeded ``seed + k``), collated: ``ids`` [N, T], ``owner`` [N, T], ``policy_mask`` [N, T-1]."""
    demos = []
    for k, kind in enumerate(kinds):
        policy = scripted_policy(kind, seed=seed + k, **(teacher_kwargs or {}).get(kind, {}))
        env = make_bugfix_env(tasks=tasks, **(env_kwargs or {}))
        demos += [scripted_rollout(policy, env, task, tok) for task in tasks for _ in range(episodes_per_task)]
    return collate(demos, tok.pad_id)


def _cloning_loss(model: TinyAgent, data: dict[str, torch.Tensor], idx: torch.Tensor, tool_coef: float
                  ) -> torch.Tensor:
    """Cross-entropy of the demonstrations ``idx`` on their policy tokens, plus ``tool_coef`` times
    that on the tool outputs of ``data["tool_mask"]``."""
    ids = data["ids"][idx]  # [b, T]
    mask = data["policy_mask"][idx]  # [b, T-1]
    T = int((data["owner"][idx] > 0).sum(1).max())  # trim shared right padding
    logp = sequence_log_probs(model, ids[:, :T])  # [b, T-1]
    loss = -masked_mean(logp, mask[:, : T - 1])  # cross-entropy on policy tokens
    if tool_coef:
        loss = loss - tool_coef * masked_mean(logp, data["tool_mask"][idx, : T - 1])
    return loss


def _practise_edits(model: TinyAgent, edit_practice: EditPractice, steps: Iterable[int], batch_size: int,
                    lr: float) -> None:
    """An Adam step (an optimizer of their own) per item of ``steps`` on the answers of ``batch_size`` practice
    transcripts."""
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in steps:
        _adam_step(opt, edit_practice.loss(model, batch_size))


def _adam_step(opt: torch.optim.Optimizer, loss: torch.Tensor) -> None:
    opt.zero_grad()
    loss.backward()
    opt.step()


#: ``progress(n, what)`` -> an iterable of ``n`` steps (e.g. a progress bar over ``range(n)``)
Progress = Callable[[int, str], Iterable[int]]


def _quiet(n: int, what: str) -> Iterable[int]:
    return range(n)


def progress_bar(n: int, what: str) -> Iterable[int]:
    """A tqdm bar on stderr over ``range(n)``, named ``what`` (steps per second and time left shown); a plain
    ``range`` where stderr is not a terminal."""
    from tqdm.auto import tqdm

    return tqdm(range(n), desc=f"  base agent: {what}", unit="step", leave=False, mininterval=1.0,
                disable=None)  # None: no bar where stderr is not a terminal (logs, CI)


#: what the base agent's weights depend on besides the arguments: the behaviour-cloning recipe
_RECIPE_FUNCTIONS = ("make_base_agent", "_demonstrations", "_cloning_loss", "_practise_edits", "_adam_step")


_BASE_FORMAT = "bugfix_gym.base_agent/1"


def cache_dir() -> Path:
    """Where trained base agents are cached: ``$BUGFIX_GYM_CACHE``, else ``$XDG_CACHE_HOME/bugfix_gym``,
    else ``~/.cache/bugfix_gym``."""
    if os.environ.get("BUGFIX_GYM_CACHE"):
        return Path(os.environ["BUGFIX_GYM_CACHE"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")).expanduser() / "bugfix_gym"


def _base_agent_key(tok: Tokenizer, kwargs: dict[str, Any]) -> str:
    """Hash of what the base agent's weights depend on: tokenizer, arguments, model sizes and the
    behaviour-cloning recipe (the source of :data:`_RECIPE_FUNCTIONS`). Refactors of the model or rollout
    code, and of this module's caching and progress display, keep the cache; an architecture change makes
    the cached weights fail to load, which retrains."""
    h = hashlib.sha256()
    config = dataclasses.asdict(TinyAgentConfig(vocab_size=tok.vocab_size))
    h.update(json.dumps({"format": _BASE_FORMAT, "words": tok.words, "kwargs": kwargs, "config": config},
                        sort_keys=True, default=str).encode())
    module = sys.modules[__name__]
    for name in _RECIPE_FUNCTIONS:
        h.update(inspect.getsource(getattr(module, name)).encode())
    return h.hexdigest()[:16]


def cached_base_agent(tok: Tokenizer, seed: int = 0, use_cache: bool = True, verbose: int = 0,
                      **kwargs) -> TinyAgent:
    """``agents.bugfix.base_agent.make_base_agent(tok, seed, **kwargs)``, cached on disk.

    The file name is a hash of the tokenizer, the arguments, the model sizes and the source of
    ``agents/bugfix/base_agent.py``, so a change of the recipe retrains. A missing, corrupt, unreadable
    or architecture-mismatched cache file is retrained and rewritten (atomically); an
    unwritable cache directory only costs the retraining next time.

    :param tok: the tokenizer
    :param seed: the base agent's seed
    :param use_cache: read and write the cache (False: always train)
    :param verbose: 1 prints where the agent came from and shows progress bars while it trains
    :param kwargs: more ``make_base_agent`` arguments (``steps``, ``episodes_per_task``, ...)
    """
    path = cache_dir() / f"base_agent-{_base_agent_key(tok, dict(seed=seed, **kwargs))}.pt"
    if use_cache and path.exists():
        try:
            agent = load_state_dict_file(path, expected_format=_BASE_FORMAT)
            if verbose:
                print(f"base agent loaded from {path}")
            return agent
        except Exception as e:  # noqa: BLE001 - corrupt / truncated / stale: retrain below
            warnings.warn(f"ignoring unreadable base-agent cache {path} ({type(e).__name__}: {e}); retraining")
    if verbose:
        print("training the base agent (scripted play, then behaviour cloning; cached afterwards) ...", flush=True)
    rng_state = torch.get_rng_state()
    agent = make_base_agent(tok, seed=seed, progress=progress_bar if verbose else None, **kwargs)
    torch.set_rng_state(rng_state)  # make_base_agent seeds the global RNG; leave it as it was
    if use_cache:
        _write_cache(path, agent)
    return agent


def _write_cache(path: Path, agent: TinyAgent) -> None:
    """Write the agent to ``path`` atomically; any failure (unwritable folder, full disk) is a
    warning, and no temporary file is left behind."""
    try:
        save_state_dict_file(path, agent, _BASE_FORMAT)  # atomic: a concurrent reader sees the old file or the new
    except Exception as e:  # noqa: BLE001 - the cache is an optimisation: never fail the caller for it
        warnings.warn(f"could not write the base-agent cache {path}: {type(e).__name__}: {e}")
