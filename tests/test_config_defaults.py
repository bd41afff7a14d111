"""A setting's default is written once, in agents/algorithms/config.py: no function of agents/ or bugfix_gym/ has a
parameter of a setting's name with a literal default, and no dict restates a default, except the ones listed here
with why (neutral values, standalone formulas, another thing of the same name)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

from agents.algorithms.config import PPOConfig, ReinforceConfig

ROOT = Path(__file__).resolve().parent.parent
#: (setting, file, function) -> why its literal default is not a second definition of the setting's
JUSTIFIED = {
    ("batch_size", "agents/bugfix/base_agent.py", "make_base_agent"): "behaviour cloning's batch, not PPO's",
    ("batch_size", "agents/algorithms/buffers.py", "minibatch_layout"): "None: the whole batch, not the setting",
    ("batch_size", "agents/algorithms/buffers.py", "get"): "None: the whole batch, not the setting",
    ("dual_clip", "agents/algorithms/losses.py", "clipped_policy_loss"): "the book formula's, for standalone use",
    ("gamma", "agents/algorithms/group_advantages.py", "discounted_turn_returns"): "1: no discount (identity)",
    ("gamma", "agents/algorithms/advantages.py", "reward_to_go"): "1: no discount (identity)",
    ("gamma", "agents/algorithms/advantages.py", "gae_policy_tokens"): "1: no discount (identity)",
    ("scale_rewards", "agents/algorithms/group_advantages.py", "group_normalised"): "the formula's, standalone",
    ("scale_rewards", "agents/algorithms/group_advantages.py", "step_group_advantage"): "the formula's, standalone",
    ("temperature", "agents/rollout/sampler.py", "collect"): "1: the model's own distribution (identity)",
    ("temperature", "agents/rollout/sampler.py", "play_tasks"): "1: the model's own distribution (identity)",
    ("temperature", "agents/decoding/decoder.py", "write_calls"): "1: the model's own distribution (identity)",
    ("temperature", "agents/cli/serve_hf.py", "write"): "1: the model's own distribution (identity)",
    ("temperature", "agents/bugfix/chat_agent.py", "write"): "1: the model's own distribution (identity)",
    ("temperature", "bugfix_gym/integrations/trl_rollout.py", "play_episode"): "1: the model's own distribution",
    ("max_call_tokens", "bugfix_gym/views/wrappers.py", "__init__"): "the token view's action length, an env option",
    ("max_call_tokens", "bugfix_gym/views/wrappers.py", "make_token_observation"): "the same env option",
    ("max_call_tokens", "bugfix_gym/views/heads_v1.py", "__init__"): "BugFixTokens-v1's action length in bytes, an "
                                                                     "env option",
    ("max_call_tokens", "bugfix_gym/views/heads_v1.py", "make_byte_token_calls"): "the same env option",
}


def _literal_defaults() -> set[tuple[str, str, str]]:
    defaults: dict[str, set[str]] = {}
    for config in (PPOConfig, ReinforceConfig):
        for field in dataclasses.fields(config):
            defaults.setdefault(field.name, set()).add(repr(field.default))
    found = set()
    for path in [*(ROOT / "agents").rglob("*.py"), *(ROOT / "bugfix_gym").rglob("*.py")]:
        where = str(path.relative_to(ROOT))
        if where == "agents/algorithms/config.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                a = node.args
                pos = a.posonlyargs + a.args
                pairs = list(zip(pos[len(pos) - len(a.defaults):], a.defaults)) + \
                    [(k, d) for k, d in zip(a.kwonlyargs, a.kw_defaults) if d is not None]
                for arg, default in pairs:
                    if arg.arg not in defaults:
                        continue
                    try:
                        literal = repr(ast.literal_eval(default))
                    except ValueError:
                        continue  # a reference to the one definition (PPOConfig.gamma, DEFAULT_MAX_CALL_TOKENS)
                    if literal != "None" or "None" in defaults[arg.arg]:  # None alone: "not given"
                        found.add((arg.arg, where, node.name))
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "dict":
                for kw in node.keywords:
                    if kw.arg in defaults:
                        try:
                            if repr(ast.literal_eval(kw.value)) in defaults[kw.arg]:
                                found.add((kw.arg, where, "dict"))
                        except ValueError:
                            pass
    return found


def test_no_setting_s_default_is_written_twice_except_the_justified_ones():
    found = _literal_defaults()
    assert ("temperature", "agents/decoding/decoder.py", "write_calls") in found  # the check sees a literal default
    assert sorted(found - set(JUSTIFIED)) == [], "a setting's default written again: read it from the config"
    assert len({name for name, _, _ in found}) <= 6  # of the 47 settings (26 before the config object was the truth,
    # 8 before the sampler took GroupSampling)
