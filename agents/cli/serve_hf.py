"""``bugfix-gym serve DIR``: a Hugging Face ``save_pretrained`` folder (``examples/trl_grpo.py``'s GRPO model, a TRL
or ``Trainer`` output) answering chats through its own chat template, as TRL trained it (docs/serve.md).

A TinyAgent model file answers with one env call through the transcript mapping
(:class:`agents.bugfix.chat_agent.ChatAgent`); a folder's LM was trained on its chat template's ids, so here the
request's messages are rendered by that template (budgeted, :func:`bugfix_gym.integrations.chat_template.
apply_chat_template`), the model samples free text up to its end-of-turn id, and the tool calls are read back
with the tokenizer's response template (``<call>NAME k=v</call>`` for :func:`~bugfix_gym.integrations.
hf_tokenizer.chat_tokenizer`). The folder is read as data (:func:`bugfix_gym.integrations.hf_checkpoint.
read_checkpoint`: bounded files, a checked safetensors header) and its config is checked as a model file's
``hf_config`` is, before anything is allocated. Needs ``transformers`` and ``safetensors`` (``.venv-trl``).
"""

from __future__ import annotations

import inspect
import json
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import torch

MAX_NEW_TOKENS = 64
"""The most tokens one answer may have unless the request says fewer (a BugFix call is about 8)."""


@dataclass
class HFAnswer:
    """One sampled answer: its ids (the end-of-turn id included when it stopped), the text before that id, the
    log-prob of each id under the distribution it was sampled from, and per id the ``top`` most likely ids with
    theirs."""

    tokens: list[int]
    text: str
    logp: list[float]
    ended: bool
    top: list[list[tuple[int, float]]] = field(default_factory=list)


class HFChatModel:
    """A causal LM and its chat-template tokenizer behind the chat endpoint; thread-safe (one answer at a time).

    :param lm: a ``transformers`` causal LM (eval mode, no dropout)
    :param tokenizer: a :class:`~bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`
    :param max_len: the context, prompt and answer together (``config.max_position_embeddings``, or
        ``--max-model-len``)
    """

    def __init__(self, lm: Any, tokenizer: Any, max_len: int):
        self.lm, self.tok, self.max_len = lm.eval(), tokenizer, int(max_len)
        self.max_call_tokens = MAX_NEW_TOKENS
        self._lock = threading.Lock()

    def encode(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """The chat's ids in the model's template, with the generation prompt (:func:`chat_messages` first)."""
        from agents.bugfix.chat_agent import ContextFull
        from bugfix_gym.integrations.chat_template import apply_chat_template

        ids = apply_chat_template(self.tok.hf, chat_messages(messages), add_generation_prompt=True)
        if len(ids) + 1 > self.max_len:
            raise ContextFull(f"the conversation is {len(ids)} tokens, the model's context {self.max_len}: start "
                              "a new episode (a shorter chat)")
        return ids

    @torch.no_grad()
    def write(self, ids: list[int], n: int = 1, temperature: float = 1.0, seed: int | None = None,
              max_tokens: int | None = None, top: int = 0) -> list[HFAnswer]:
        """``n`` answers sampled after ``ids`` with the KV cache, each up to the end-of-turn id or ``max_tokens``.

        :param ids: the prompt (:meth:`encode`)
        :param n: how many answers (one batch)
        :param temperature: 0 greedy (log-probs at temperature 1), else sampling at that temperature
        :param seed: seeds the sampling (None: torch's global generator)
        :param max_tokens: the most tokens an answer may have (default :data:`MAX_NEW_TOKENS`, and the context)
        :param top: how many of the most likely ids to report at each step (``top_logprobs``)
        """
        limit = min(max_tokens or MAX_NEW_TOKENS, self.max_len - len(ids))
        generator = None if seed is None else torch.Generator().manual_seed(int(seed))
        eoc = self.tok.eoc_id
        with self._lock:
            device = next(self.lm.parameters()).device
            feed = torch.tensor([ids] * n, device=device)  # [n, T]
            arg = "cache" if "cache" in inspect.signature(self.lm.forward).parameters else "past_key_values"
            out = self.lm(input_ids=feed, use_cache=True)
            cache = out[arg]  # transformers >= 5.2x calls the KV cache "cache"
            tokens: list[list[int]] = [[] for _ in range(n)]
            logps: list[list[float]] = [[] for _ in range(n)]
            tops: list[list[list[tuple[int, float]]]] = [[] for _ in range(n)]
            live = [True] * n
            logits = out.logits[:, -1].float()  # [n, V]
            for _ in range(limit):
                logp = torch.log_softmax(logits / (temperature or 1.0), -1)  # [n, V]
                if temperature == 0:
                    pick = logp.argmax(-1)  # [n]
                else:
                    pick = torch.multinomial(logp.exp().cpu(), 1, generator=generator)[:, 0].to(device)
                for b in range(n):
                    if live[b]:
                        tokens[b].append(int(pick[b]))
                        logps[b].append(float(logp[b, pick[b]]))
                        if top:
                            values, index = logp[b].topk(min(top, logp.size(-1)))
                            tops[b].append([(int(i), float(v)) for i, v in zip(index.tolist(), values.tolist())])
                        live[b] = int(pick[b]) != eoc
                if not any(live):
                    break
                out = self.lm(input_ids=pick[:, None], use_cache=True, **{arg: cache})
                cache, logits = out[arg], out.logits[:, -1].float()
        return [HFAnswer(t, self.tok.decode(t), lp, bool(t) and t[-1] == eoc, tp)
                for t, lp, tp in zip(tokens, logps, tops)]

    def token_text(self, token: int) -> str:
        """One id as text (its end-of-turn id included), for ``logprobs``."""
        return self.tok.decode([token], stop_at_eoc=False)

    def tool_calls(self, answer: HFAnswer, prompt: list[int]) -> list[dict[str, Any]]:
        """The tool calls of an answer, read with the tokenizer's response template (``parse_response``, after
        the prompt ``prompt`` that the answer continues); none when it has none or the text does not parse."""
        hf = self.tok.hf
        if getattr(hf, "response_template", None) is None and getattr(hf, "response_schema", None) is None:
            return []
        try:
            parsed = hf.parse_response(answer.tokens, prefix=list(prompt))
        except Exception:  # noqa: BLE001 - malformed text is an answer without calls, as TRL reads it
            return []
        calls = []
        for call in (parsed.get("tool_calls") or []) if isinstance(parsed, dict) else []:
            function = call.get("function", call) if isinstance(call, dict) else {}
            arguments = function.get("arguments") or {}
            calls.append({"name": str(function.get("name", "")),
                          "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)})
        return calls


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """An OpenAI chat as the template's messages: roles ``system``, ``user``, ``assistant``, ``tool`` with text
    content; an assistant's ``tool_calls`` keep their function name and their arguments as an object (OpenAI
    sends them as a JSON string). A malformed chat is a one-line ``ChatError``."""
    from bugfix_gym.integrations.chat import ChatError

    if not isinstance(messages, list) or not messages:
        raise ChatError("messages must be a non-empty list of {role, content} objects")
    out = []
    for k, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("system", "developer", "user", "assistant", "tool"):
            raise ChatError(f"message {k} needs a role of system, user, assistant or tool")
        content = m.get("content")
        if isinstance(content, list):  # OpenAI's content parts: the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict) and isinstance(
                p.get("text"), str))
        if content is not None and not isinstance(content, str):
            raise ChatError(f"message {k}'s content must be text")
        item: dict[str, Any] = {"role": "system" if m["role"] == "developer" else m["role"], "content": content or ""}
        if m["role"] == "assistant" and m.get("tool_calls"):
            item["tool_calls"] = [_tool_call(call, k) for call in _list(m["tool_calls"], k)]
        out.append(item)
    return out


def _list(value: Any, k: int) -> list[Any]:
    from bugfix_gym.integrations.chat import ChatError

    if not isinstance(value, list) or len(value) > 8:
        raise ChatError(f"message {k}'s tool_calls must be a list (of at most 8)")
    return value


def _tool_call(call: Any, k: int) -> dict[str, Any]:
    from bugfix_gym.integrations.chat import ChatError

    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ChatError(f"message {k}'s tool call needs a function with a name")
    arguments = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments[:4096]) if arguments.strip() else {}
        except (ValueError, RecursionError):
            arguments = {}
    if not isinstance(arguments, dict):
        arguments = {}
    kept = {str(key)[:64]: value for key, value in list(arguments.items())[:8]
            if isinstance(value, (str, int, float, bool))}
    return {"type": "function", "function": {"name": function["name"][:64], "arguments": kept}}


def load_served(path: Path, command: str = "serve", max_len: int | None = None) -> HFChatModel:
    """The ``save_pretrained`` folder at ``path`` as an :class:`HFChatModel`, or a one-line error: its files are read
    bounded and checked (:func:`~bugfix_gym.integrations.hf_checkpoint.read_checkpoint`), its config as a model
    file's ``hf_config`` (sizes, dtype, attention, the parameters its weights file can hold; built on the meta
    device first), its weights loaded into a model built from that config (every name and shape as the model
    has them, every value finite).

    :param path: the folder
    :param command: the sub-command the error names
    :param max_len: the context to serve (at most the config's positions; default: the config's)
    """
    from agents.cli.flags import usage_error
    from agents.files.checkpoint import ModelFileError, _check_hf_config
    from agents.model.hf_adapter import lm_from_config
    from bugfix_gym.integrations.hf_checkpoint import read_checkpoint

    try:
        ckpt = read_checkpoint(path)
        _check_hf_config(ckpt.config, len(ckpt.weights_blob), str(path / "config.json"))
        lm = lm_from_config(ckpt.config)
        _load_weights(lm, ckpt.weights(), str(path / "model.safetensors"))
    except ImportError as e:
        raise usage_error(command, f"serving a save_pretrained folder needs transformers and safetensors: run it "
                                   f"in .venv-trl (make trl-venv) ({e.name or e})") from None
    except (ValueError, ModelFileError) as e:
        raise usage_error(command, str(e).splitlines()[0]) from None
    positions = int(getattr(lm.config, "max_position_embeddings", 0) or 0) or 2048
    if max_len is not None and max_len > positions:
        raise usage_error(command, f"--max-model-len {max_len} is beyond the model's {positions} positions")
    rows = int(lm.get_output_embeddings().weight.shape[0])  # type: ignore[operator]
    if rows < ckpt.tokenizer.vocab_size:
        raise usage_error(command, f"{path}: the model has {rows} output rows for a tokenizer of "
                                   f"{ckpt.tokenizer.vocab_size} ids")
    _response_template(ckpt.tokenizer)
    return HFChatModel(lm, ckpt.tokenizer, max_len or positions)


def _load_weights(lm: Any, state: dict[str, Any], name: str) -> None:
    """``state`` into ``lm``: no unknown name, every shape the model's, every value finite; a name the model ties to
    another (the output embedding) may be absent."""
    own = lm.state_dict()
    unknown = [k for k in state if k not in own]
    if unknown:
        raise ValueError(f"{name} holds {unknown[0][:60]!r}, which the config's model has not")
    for key, tensor in state.items():
        if tuple(tensor.shape) != tuple(own[key].shape):
            raise ValueError(f"{name}: {key[:60]} has shape {list(tensor.shape)}, the model {list(own[key].shape)}")
        if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
            raise ValueError(f"{name}: {key[:60]} holds a value that is not finite")
    missing = set(own) - set(state)
    tied = {k for k in missing if k.endswith("lm_head.weight")} if getattr(lm.config, "tie_word_embeddings",
                                                                           False) else set()
    if missing - tied:
        raise ValueError(f"{name} lacks {sorted(missing - tied)[0][:60]!r}; save the whole model with save_pretrained")
    lm.load_state_dict(state, strict=False)
    if tied:
        lm.tie_weights()


def _response_template(tokenizer: Any) -> None:
    """Our chat template's response template, when the folder's tokenizer is :func:`chat_tokenizer`'s (a
    ``response_template`` is an attribute that ``save_pretrained`` does not keep)."""
    from bugfix_gym.integrations.hf_tokenizer import CHAT_TEMPLATE, RESPONSE_TEMPLATE

    hf = tokenizer.hf
    if getattr(hf, "response_template", None) is None and hf.chat_template == CHAT_TEMPLATE:
        hf.response_template = RESPONSE_TEMPLATE
