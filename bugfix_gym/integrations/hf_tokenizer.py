"""A Hugging Face chat tokenizer built from BugFix's vocabulary, with no download.

:func:`chat_tokenizer` returns a ``transformers.PreTrainedTokenizerFast`` (a ``tokenizers`` WordLevel
model) whose pieces are the words of :func:`bugfix_gym.tokenizer.fixed_tokenizer`, each with and without
a leading space, plus single spaces, newlines and a few template words; its decoder concatenates
pieces, so ``decode(encode(text)) == text`` for every text made of known pieces. It carries:

* a chat template (roles ``<|user|>``, ``<|assistant|>``, ``<|tool|>``; every message ends with the EOS
  ``<|end|>``; a tool call renders as ``<call>edit op=fix_init</call>``). It renders no tool list:
  BugFix's prompt already lists the nine calls. It is prefix-preserving (what TRL's multi-turn loop
  needs) and renders a whole tool-calling conversation (TRL's ``supports_tool_calling``).
* a ``response_template`` (transformers' response parsing) that reads those calls back as
  ``{"type": "function", "function": {"name": "edit", "arguments": {"op": "fix_init"}}}``.

``trap=True`` adds the **retokenisation trap**: one merged piece per call word and the closing tag
(``read</call>``, ``fix_init</call>``, ...). :func:`call_ids` never uses them, so a loop that appends
sampled ids is unaffected; a loop that decodes the history to text and encodes it again gets the
merged id where the model wrote two, and its turn-``t+1`` ids no longer start with turn ``t``'s.

:class:`ChatIds` builds an episode's ids the way TRL's ``GRPOTrainer`` tool loop does (prompt ids,
then the model's call ids and the env's tool-suffix ids appended, never re-tokenised), with the
mask that says who wrote each token.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..ops import FIX_OPS

EOS, PAD, UNK = "<|end|>", "<pad>", "<unk>"
ROLES = ("<|system|>", "<|user|>", "<|assistant|>", "<|tool|>")
CALL_OPEN, CALL_CLOSE = "<call>", "</call>"
TOOL_NAMES = ("read", "test", "edit", "revert", "submit")
CALL_WORDS = ("read", "test", "revert", "submit", *FIX_OPS)
_PIECES = (r"<call>|</call>| ?[A-Za-z_][A-Za-z_0-9]*| ?\d+| ?(?:==|!=|<=|>=|\+=|-=|\*=|/=|//|\*\*|->)"
           r"| ?[^\sA-Za-z_0-9]|\n| |\s")
_TRAP = "(?:" + "|".join(CALL_WORDS) + ")</call>|"
# words the adapters say that the task library does not (BugFixToolEnv's messages, the call syntax)
EXTRA_WORDS = ("op", "ops", "=", "episode", "has", "ended", "over", "error", "{", "}", "'", '"')

CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "<|assistant|>{{ m.content or '' }}"
    "{%- for tc in m.tool_calls or [] -%}{%- set f = tc.function if tc.function is defined else tc -%}"
    "<call>{{ f.name }}{%- for k, v in (f.arguments or {}).items() %} {{ k }}={{ v }}{%- endfor -%}</call>"
    "{%- endfor -%}<|end|>"
    "{%- else -%}<|{{ m.role }}|>{{ m.content }}<|end|>{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}<|assistant|>{%- endif -%}"
)
"""Prefix-preserving: a message renders the same whatever follows it, and nothing sits between one
message's ``<|end|>`` and the next role token."""

RESPONSE_TEMPLATE: dict[str, Any] = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|assistant|>",
    "fields": {
        "tool_calls": {
            "open_pattern": r"<call>(?P<name>[A-Za-z_]+)",
            "close_pattern": r"</call>",
            "repeats": True,
            "content": "kv-lines",
            "content_args": {"line_sep": " ", "kv_sep": "="},
            "transform": {"type": "function", "function": {"name": "{name}", "arguments": "{content}"}},
        },
        "content": {"close_pattern": r"<\|end\|>", "content": "text"},
    },
}
"""transformers' response template (response parsing) for :data:`CHAT_TEMPLATE`'s tool calls."""


def vocabulary(words: Sequence[str] | None = None, trap: bool = False) -> list[str]:
    """The pieces, in id order: specials, call tags, whitespace, then each word bare and with a leading space.

    :param words: the words (default: :func:`bugfix_gym.tokenizer.fixed_tokenizer`'s, which cover the
        book's tasks and the generator's train templates)
    :param trap: add the retokenisation trap's merged pieces at the end
    """
    from ..tokenizer import SPECIALS, fixed_tokenizer

    words = fixed_tokenizer().words if words is None else list(words)
    pieces = [PAD, UNK, EOS, *ROLES, CALL_OPEN, CALL_CLOSE, "\n", " "]
    for word in [*words, *EXTRA_WORDS, *TOOL_NAMES]:
        if word in SPECIALS or not word.strip():
            continue
        pieces += [word, " " + word]
    if trap:
        pieces += [w + CALL_CLOSE for w in CALL_WORDS]
    return list(dict.fromkeys(pieces))


def chat_tokenizer(words: Sequence[str] | None = None, *, trap: bool = False) -> Any:
    """A ``PreTrainedTokenizerFast`` with BugFix's pieces, :data:`CHAT_TEMPLATE` and :data:`RESPONSE_TEMPLATE`.

    :param words: the vocabulary's words (default: :func:`bugfix_gym.tokenizer.fixed_tokenizer`'s)
    :param trap: the retokenisation trap (module docstring): a text-level loop then fails loudly
    :return: a tokenizer with EOS ``<|end|>``, pad ``<pad>`` (left padding, as TRL's GRPO asks) and unk ``<unk>``
    """
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ImportError("chat_tokenizer needs tokenizers and transformers: make trl-venv (docs/llm_trainers.md)") \
            from None
    pieces = vocabulary(words, trap)
    model = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token=UNK))
    pattern = (_TRAP if trap else "") + _PIECES
    model.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    model.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, eos_token=EOS, pad_token=PAD, unk_token=UNK,
                                        extra_special_tokens=list(ROLES), padding_side="left",
                                        clean_up_tokenization_spaces=False, model_max_length=4096)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    tokenizer.init_kwargs["bugfix_trap"] = trap
    return tokenizer


def call_ids(tokenizer: Any, name: str, op: str | None = None) -> list[int]:
    """The ids a model writes for one tool call, EOS included, piece by piece (never the trap's merges).

    :param tokenizer: a :func:`chat_tokenizer`
    :param name: ``read``, ``test``, ``edit``, ``revert`` or ``submit``
    :param op: the edit op (only with ``edit``)
    """
    pieces = [CALL_OPEN, name, *((" op", "=", op) if op is not None else ()), CALL_CLOSE, EOS]
    ids = tokenizer.convert_tokens_to_ids(pieces)
    if tokenizer.unk_token_id in ids:
        raise ValueError(f"call {name!r} {op!r} has a piece outside this tokenizer's vocabulary; use one of "
                         f"{', '.join(TOOL_NAMES)} and an op of bugfix_gym.FIX_OPS")
    return ids


class ChatIds:
    """An episode's ids built token in, token out, the way TRL's ``GRPOTrainer`` tool loop builds them.

    ``prompt_ids`` is the chat template on the first user message (with the generation prompt); every
    model turn appends the ids it sampled (:meth:`add_model`), every tool result appends the template's
    tool suffix (:meth:`add_tool`: ``<|tool|>`` content ``<|end|><|assistant|>``). Nothing already
    appended is ever encoded again. ``mask`` has one entry per completion id: 1 = the model wrote it.

    :param tokenizer: a :func:`chat_tokenizer` (or any tokenizer with a prefix-preserving chat template)
    :param prompt: the first user message's text
    """

    def __init__(self, tokenizer: Any, prompt: str):
        self.tokenizer = tokenizer
        self.prompt_ids: list[int] = list(tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True, return_dict=False))
        self.completion_ids: list[int] = []
        self.mask: list[int] = []
        self.turns: list[dict[str, list[int]]] = []

    def add_model(self, ids: Sequence[int]) -> None:
        """Append what the model sampled at this turn (and record the turn's input and output)."""
        self.turns.append({"input_ids": self.prompt_ids + self.completion_ids, "output_ids": list(ids)})
        self.completion_ids += list(ids)
        self.mask += [1] * len(ids)

    def add_tool(self, name: str, content: str) -> None:
        """Append the tool's answer as the chat template renders it after an assistant turn."""
        suffix = tool_suffix_ids(self.tokenizer, name, content)
        self.completion_ids += suffix
        self.mask += [0] * len(suffix)


def tool_suffix_ids(tokenizer: Any, name: str, content: str) -> list[int]:
    """The ids the template puts after an assistant turn for one tool result, up to the next generation
    prompt: rendered after a dummy conversation and cut off it (TRL's ``_get_tool_suffix_ids``)."""
    dummy = [{"role": "user", "content": "dummy"},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                 "name": name, "arguments": {}}}]}]
    before = tokenizer.apply_chat_template(dummy, tokenize=True, return_dict=False)
    after = tokenizer.apply_chat_template(dummy + [{"role": "tool", "name": name, "content": content}],
                                          add_generation_prompt=True, tokenize=True, return_dict=False)
    if list(after[:len(before)]) != list(before):
        raise ValueError("the chat template is not prefix-preserving: a tool result changes the turns before it")
    return list(after[len(before):])
