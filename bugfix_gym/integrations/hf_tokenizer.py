"""A Hugging Face chat tokenizer built from BugFix's vocabulary, with no download.

:func:`chat_tokenizer` returns a ``transformers.PreTrainedTokenizerFast`` (a ``tokenizers`` WordLevel
model) whose pieces are the words of :func:`bugfix_gym.core.vocabulary.fixed_tokenizer`, each with and without
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

:class:`ChatTemplateTokenizer` puts any ``PreTrainedTokenizerFast`` with a chat template where
:class:`bugfix_gym.Tokenizer` stands (``BugFixTokens-v0``, the agents' sampler and policy): its segments
are the template's prompt, the sampled call ids with the end-of-turn id, and the template's tool
suffix (docs/hf_tokenizers.md). :func:`chatml_tokenizer` gives the same words Qwen2's ChatML template
(:data:`CHATML_TEMPLATE`), with its own form of the trap.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from ..contract.tokens import register_tokenizer_format
from ..edits.ops import FIX_OPS
from .chat_template import apply_chat_template

HF_FORMAT = "bugfix_gym.ChatTemplateTokenizer/1"  # to_dict()["format"] of ChatTemplateTokenizer

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

    :param words: the words (default: :func:`bugfix_gym.core.vocabulary.fixed_tokenizer`'s, which cover the
        book's tasks and the generator's train templates)
    :param trap: add the retokenisation trap's merged pieces at the end
    """
    from ..core.vocabulary import SPECIALS, fixed_tokenizer

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

    :param words: the vocabulary's words (default: :func:`bugfix_gym.core.vocabulary.fixed_tokenizer`'s)
    :param trap: the retokenisation trap (module docstring): a text-level loop then fails loudly
    :return: a tokenizer with EOS ``<|end|>``, pad ``<pad>`` (left padding, as TRL's GRPO asks) and unk ``<unk>``
    """
    pattern = (_TRAP if trap else "") + _PIECES
    tokenizer = _words_tokenizer(vocabulary(words, trap), pattern, EOS, ROLES)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.response_template = RESPONSE_TEMPLATE
    tokenizer.init_kwargs["bugfix_trap"] = trap
    return tokenizer


def _words_tokenizer(pieces: Sequence[str], pattern: str, eos: str, specials: Sequence[str]) -> Any:
    """A WordLevel ``PreTrainedTokenizerFast`` over ``pieces``, split by ``pattern``, concatenating decoder."""
    try:
        from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ImportError("chat_tokenizer needs tokenizers and transformers: make trl-venv (docs/llm_trainers.md)") \
            from None
    model = Tokenizer(models.WordLevel({p: i for i, p in enumerate(pieces)}, unk_token=UNK))
    model.pre_tokenizer = pre_tokenizers.Split(Regex(pattern), behavior="isolated")
    model.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=model, eos_token=eos, pad_token=PAD, unk_token=UNK,
                                   extra_special_tokens=list(specials), padding_side="left",
                                   clean_up_tokenization_spaces=False, model_max_length=4096)


CHATML_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The ChatML chat template Qwen2-Instruct ships (``<|im_start|>role\\n ... <|im_end|>\\n``, a default system
message), written out so that nothing is downloaded. Each turn ends with ``<|im_end|>`` and a newline."""
CHATML_SPECIALS = ("<|im_start|>", "<|im_end|>")
CHATML_WORDS = ("system", "user", "assistant", "tool", "You", "are", "a", "helpful")
_CHATML_TRAP = "\n(?:" + "|".join(TOOL_NAMES) + ")(?![A-Za-z_0-9])|"


def chatml_tokenizer(words: Sequence[str] | None = None, *, trap: bool = False) -> Any:
    """The words of :func:`chat_tokenizer` with :data:`CHATML_TEMPLATE` (Qwen2's), EOS ``<|im_end|>``.

    ``trap=True`` adds the ChatML form of the retokenisation trap: one merged piece per tool name and the
    newline before it (``\\nread``, ``\\nedit``, ...). The template writes ``<|im_start|>assistant\\n``
    and then the call, so a loop that renders the history as text and encodes it again gets the merged
    id where the model's turn started after the generation prompt's newline; a loop that appends the
    sampled ids never sees it.

    :param words: the vocabulary's words (default: :func:`bugfix_gym.core.vocabulary.fixed_tokenizer`'s)
    :param trap: add the merged pieces
    :return: a tokenizer with EOS ``<|im_end|>``, pad ``<pad>`` and unk ``<unk>``
    """
    from ..core.vocabulary import fixed_tokenizer

    base = fixed_tokenizer().words if words is None else list(words)
    pieces = [*vocabulary([*base, *CHATML_WORDS]), *CHATML_SPECIALS]
    pieces += ["\n" + name for name in TOOL_NAMES] if trap else []
    tokenizer = _words_tokenizer(pieces, (_CHATML_TRAP if trap else "") + _PIECES, CHATML_SPECIALS[1],
                                 CHATML_SPECIALS)
    tokenizer.chat_template = CHATML_TEMPLATE
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
        self.prompt_ids: list[int] = apply_chat_template(tokenizer, [{"role": "user", "content": prompt}],
                                                         add_generation_prompt=True)
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


def tool_suffix_ids(tokenizer: Any, name: str, content: str, end_id: int | None = None,
                    before: list[int] | None = None) -> list[int]:
    """The ids the template puts after an assistant turn for one tool result, up to the next generation
    prompt: rendered after a dummy conversation and cut off it right after the dummy assistant turn's
    last end-of-turn id, as TRL's ``_get_tool_suffix_ids`` does (a ChatML turn ends ``<|im_end|>\\n``: the
    model stops at ``<|im_end|>``, so the newline belongs to the suffix).

    :param tokenizer: a tokenizer with a chat template
    :param name: the tool's name (some templates write it)
    :param content: the tool's answer
    :param end_id: the end-of-turn id (default: the EOS id)
    :param before: the dummy conversation's ids (:func:`dummy_turn_ids`), if the caller keeps them
    """
    dummy = _dummy(name)
    before = dummy_turn_ids(tokenizer, name) if before is None else before
    after = apply_chat_template(tokenizer, dummy + [{"role": "tool", "name": name, "content": content}],
                                add_generation_prompt=True)
    end = tokenizer.eos_token_id if end_id is None else end_id
    if end in before:
        before = before[: len(before) - before[::-1].index(end)]
    if list(after[:len(before)]) != before:
        raise ValueError("the chat template is not prefix-preserving: a tool result changes the turns before it")
    return list(after[len(before):])


def _dummy(name: str) -> list[dict[str, Any]]:
    return [
        {"role": "user", "content": "dummy"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": name, "arguments": {}}}]}]


def dummy_turn_ids(tokenizer: Any, name: str) -> list[int]:
    """The ids of :func:`tool_suffix_ids`' dummy conversation (a user message and an assistant tool call),
    which do not depend on the tool's answer."""
    return apply_chat_template(tokenizer, _dummy(name))


MAX_TOKENIZER_CHARS = 6 << 20
"""The largest ``tokenizer.json`` a :class:`ChatTemplateTokenizer` saves (a model file's ``data`` entry holds 8 MiB)."""
_DICT_KEYS = ("tokenizer_json", "chat_template", "end_token", "eos_token", "pad_token", "unk_token", "bos_token",
              "tool_name")


class ChatTemplateTokenizer:
    """Any Hugging Face ``PreTrainedTokenizerFast`` with a chat template, where :class:`bugfix_gym.Tokenizer`
    stands (it has what :class:`bugfix_gym.contract.tokens.TokenizerLike` lists): ``gym.make("BugFixTokens-v0",
    tokenizer=...)``, ``EpisodeSampler(..., tokenizer=...)``, ``policy_kwargs=dict(tokenizer=...)``.

    Segments (:meth:`segment_ids`), token in, token out: the prompt is the template's rendering of the first
    user message with the generation prompt; a policy segment is the call's ids and the end-of-turn id
    (``eoc_id``, the role ``<eoc>`` plays for ours); a tool segment is the template's tool suffix
    (:func:`tool_suffix_ids`: from the end of the assistant turn to the next generation prompt). Appending
    them gives the ids the template renders for the whole conversation, as long as the policy's ids are
    those ``encode`` gives for its text (the call grammar writes exactly those) and the template is
    prefix-preserving.

    :param tokenizer: a ``PreTrainedTokenizerFast`` whose ``chat_template`` renders ``user``, ``assistant``
        and ``tool`` messages
    :param end_token: the token that ends an assistant turn (default: the EOS token)
    :param tool_name: the tool name written into tool messages (some templates render it)
    """

    def __init__(self, tokenizer: Any, *, end_token: str | None = None, tool_name: str = "bugfix"):
        if not hasattr(tokenizer, "apply_chat_template") or not isinstance(getattr(tokenizer, "chat_template",
                                                                                   None), str):
            raise ValueError("ChatTemplateTokenizer needs a transformers tokenizer with a chat template (a str "
                             "tokenizer.chat_template); set one, e.g. hf_tokenizer.CHATML_TEMPLATE")
        self.hf = tokenizer
        self.end_token = end_token or tokenizer.eos_token
        end = tokenizer.convert_tokens_to_ids(self.end_token) if self.end_token else None
        if not isinstance(end, int) or end < 0 or end == tokenizer.unk_token_id:
            raise ValueError(f"the end-of-turn token {self.end_token!r} is not in the vocabulary; pass "
                             "end_token= the token the chat template ends an assistant turn with")
        self.eoc_id = int(end)
        self.pad_id = int(tokenizer.pad_token_id) if tokenizer.pad_token_id is not None else self.eoc_id
        self.unk_id = int(tokenizer.unk_token_id) if tokenizer.unk_token_id is not None else -1
        self.tool_name = str(tool_name)
        self._vocab_size = len(tokenizer)
        self._dummy_ids: list[int] | None = None
        turn = apply_chat_template(tokenizer, [{"role": "user", "content": "x"}, {"role": "assistant", "content": "x"}])
        if self.eoc_id not in turn:
            raise ValueError(f"the chat template does not end an assistant turn with {self.end_token!r}; pass "
                             "end_token= the token it does end one with")

    @property
    def vocab_size(self) -> int:
        """Every id the model may see or write (``len(tokenizer)``: added tokens included)."""
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        """Plain text -> ids, no special tokens added (a failure of the tokenizer's native code, a Rust panic
        included, is a one-line ``ValueError``)."""
        try:
            return list(self.hf.encode(text, add_special_tokens=False))
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - tokenizers' Rust panics are BaseExceptions
            raise ValueError(f"the tokenizer cannot encode this text ({_first_line(err)})") from None

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str:
        """Ids -> text up to the end-of-turn id, pads and ids outside the vocabulary left out: the text the
        env receives for a call."""
        kept = []
        for i in ids:
            i = int(i)
            if stop_at_eoc and i == self.eoc_id:
                break
            if i != self.pad_id and 0 <= i < self._vocab_size:
                kept.append(i)
        return self.hf.decode(kept, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def segment_ids(self, owner: int, text: str) -> list[int]:
        """One transcript segment's ids: owner 1 the prompt, 2 a call, 3 a tool output (see the class)."""
        if owner == 1:
            return apply_chat_template(self.hf, [{"role": "user", "content": text}], add_generation_prompt=True)
        if owner == 2:
            return self.encode(text) + [self.eoc_id]
        if self._dummy_ids is not None:  # the same for every tool output (rendered once), unless the template
            try:  # writes something that changes, such as today's date (Llama 3's strftime_now): then again
                return tool_suffix_ids(self.hf, self.tool_name, text, self.eoc_id, before=self._dummy_ids)
            except ValueError:
                pass
        self._dummy_ids = dummy_turn_ids(self.hf, self.tool_name)
        return tool_suffix_ids(self.hf, self.tool_name, text, self.eoc_id, before=self._dummy_ids)

    def to_dict(self) -> dict:
        """The ``tokenizer.json`` string, the chat template and the special tokens (:meth:`from_dict`)."""
        data = {"format": HF_FORMAT, "tokenizer_json": self.hf.backend_tokenizer.to_str(),
                "chat_template": self.hf.chat_template, "end_token": self.end_token,
                "eos_token": self.hf.eos_token, "pad_token": self.hf.pad_token, "unk_token": self.hf.unk_token,
                "bos_token": self.hf.bos_token, "tool_name": self.tool_name}
        if len(data["tokenizer_json"]) > MAX_TOKENIZER_CHARS:
            raise ValueError(f"this tokenizer's tokenizer.json has {len(data['tokenizer_json'])} characters, more "
                             f"than the {MAX_TOKENIZER_CHARS} a model file keeps; use a smaller vocabulary")
        return data

    @classmethod
    def from_dict(cls, data: Any) -> "ChatTemplateTokenizer":
        """The tokenizer :meth:`to_dict` saved; a bad dict is a one-line ``ValueError``."""
        check_tokenizer_dict(data)
        try:
            from tokenizers import Tokenizer
            from transformers import PreTrainedTokenizerFast
        except ImportError:
            raise ImportError("this policy's tokenizer is a Hugging Face tokenizer: install tokenizers and "
                              "transformers (make trl-venv) to load it") from None
        try:
            backend = Tokenizer.from_str(data["tokenizer_json"])
            specials = {k: data[k] for k in ("eos_token", "pad_token", "unk_token", "bos_token") if data[k]}
            hf = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False, **specials)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - tokenizers raises its own types, and Rust panics
            raise ValueError(f"the saved tokenizer.json does not load ({_first_line(err)}); the model file is "
                             "damaged") from None
        hf.chat_template = data["chat_template"]
        return cls(hf, end_token=data["end_token"], tool_name=data["tool_name"])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChatTemplateTokenizer) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"ChatTemplateTokenizer(vocab_size={self.vocab_size}, end_token={self.end_token!r})"


def _first_line(err: BaseException) -> str:
    """``Type: first line of the message``, at most 160 characters."""
    text = str(err).splitlines()[0][:120] if str(err).strip() else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


def check_tokenizer_dict(data: Any) -> None:
    """A one-line ``ValueError`` unless ``data`` looks like a :meth:`ChatTemplateTokenizer.to_dict`."""
    if not isinstance(data, dict) or data.get("format") != HF_FORMAT:
        raise ValueError(f"not a saved chat-template tokenizer (expected format {HF_FORMAT!r})")
    missing = [k for k in _DICT_KEYS if k not in data]
    if missing:
        raise ValueError(f"the saved chat-template tokenizer lacks {', '.join(missing)}; the model file is damaged")
    bad = [k for k in _DICT_KEYS if not (data[k] is None and k in ("eos_token", "pad_token", "unk_token",
                                                                   "bos_token", "end_token"))
           and not isinstance(data[k], str)]
    if bad:
        raise ValueError(f"the saved chat-template tokenizer's {', '.join(bad)} must be strings; the model file "
                         "is damaged")
    if len(data["tokenizer_json"]) > MAX_TOKENIZER_CHARS or len(data["chat_template"]) > MAX_TOKENIZER_CHARS:
        raise ValueError(f"the saved tokenizer is larger than {MAX_TOKENIZER_CHARS} characters; not a file this "
                         "package wrote")


register_tokenizer_format(HF_FORMAT, ChatTemplateTokenizer.from_dict)
