"""A byte-level BPE tokenizer: the byte tokenizer's ids and specials, with merges that make a text ~3x shorter.

:class:`BPETokenizer` stands where :class:`~bugfix_gym.contract.byte_tokenizer.ByteTokenizer` stands (the same
interface and specials: ``<pad>`` 0, ``<eoc>`` 1, ``<turn>`` 2, ``unk_id == -1``). It wraps a Hugging Face
``tokenizers`` byte-level BPE (GPT-2's pre-tokenizer, its 256 byte symbols, then the trained merges), so every
text encodes without an unknown token and ``decode(encode(text)) == text``, and encoding is deterministic: a call's
ids are always the same, which the legal-call grammar's tables need. A text that spells a special (``"<eoc>"``)
is encoded as its bytes, never as the special.

``tokenizers`` is imported only when a BPE tokenizer is built, so importing ``bugfix_gym`` never imports it.
:meth:`BPETokenizer.to_dict` keeps the whole ``tokenizer.json``: a saved policy loads without the data file it
was trained into. BugFix-v1's trained one is :func:`bugfix_gym.core.bpe_v1.load_bpe_v1`.
"""

from __future__ import annotations

from typing import Any, Iterable

from .tokens import OWNER_POLICY, register_tokenizer_format

BPE_FORMAT = "bugfix_gym.BPETokenizer/1"
SPECIALS = ("<pad>", "<eoc>", "<turn>")
"""The specials, ids 0, 1, 2 (the byte tokenizer's)."""
PAD_ID, EOC_ID, TURN_ID = 0, 1, 2
MAX_TOKENIZER_CHARS = 4 << 20
"""The largest ``tokenizer.json`` a saved policy may carry."""


class BPETokenizer:
    """Text <-> byte-level BPE ids (:class:`bugfix_gym.contract.tokens.TokenizerLike`).

    ``decode`` drops specials and ids out of range and turns bytes that are not valid UTF-8 (a policy's ids cut
    inside a character) into U+FFFD, as the byte tokenizer does.

    :param tokenizer_json: a ``tokenizers`` byte-level BPE as its ``tokenizer.json`` text, with ``<pad>``,
        ``<eoc>``, ``<turn>`` as ids 0, 1, 2 (:func:`train_bpe` makes one)
    """

    pad_id = PAD_ID
    eoc_id = EOC_ID
    turn_id = TURN_ID
    unk_id = -1

    def __init__(self, tokenizer_json: str):
        if not isinstance(tokenizer_json, str) or len(tokenizer_json) > MAX_TOKENIZER_CHARS:
            raise ValueError(f"tokenizer_json must be a tokenizer.json text of at most {MAX_TOKENIZER_CHARS} "
                             "characters")
        Tokenizer = _tokenizers().Tokenizer
        try:
            hf = Tokenizer.from_str(tokenizer_json)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as err:  # noqa: BLE001 - tokenizers raises its own types, and Rust panics
            raise ValueError(f"not a tokenizer.json ({type(err).__name__}: {str(err)[:120]})") from None
        if [hf.token_to_id(s) for s in SPECIALS] != [PAD_ID, EOC_ID, TURN_ID]:
            raise ValueError(f"a BPE tokenizer needs the specials {', '.join(SPECIALS)} as ids 0, 1, 2")
        hf.encode_special_tokens = True  # "<eoc>" in a text is its bytes, never the special
        self._hf = hf
        self._json = hf.to_str()
        self._vocab_size = int(hf.get_vocab_size(with_added_tokens=True))

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def encode(self, text: str) -> list[int]:
        """Text -> ids (no specials)."""
        return list(self._hf.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, stop_at_eoc: bool = True) -> str:
        """Ids -> text, up to ``<eoc>`` (with ``stop_at_eoc``); specials and ids out of range are dropped."""
        kept: list[int] = []
        for i in ids:
            i = int(i)
            if stop_at_eoc and i == EOC_ID:
                break
            if len(SPECIALS) <= i < self._vocab_size:
                kept.append(i)
        return self._hf.decode(kept, skip_special_tokens=True) if kept else ""

    def segment_ids(self, owner: int, text: str) -> list[int]:
        """One transcript segment: a call (owner 2) ends with ``<eoc>``, a prompt or tool output with ``<turn>``."""
        return self.encode(text) + [EOC_ID if owner == OWNER_POLICY else TURN_ID]

    def to_dict(self) -> dict:
        """The format and the whole ``tokenizer.json`` text (:meth:`from_dict`)."""
        return {"format": BPE_FORMAT, "tokenizer_json": self._json}

    @classmethod
    def from_dict(cls, data: Any) -> "BPETokenizer":
        if not isinstance(data, dict) or data.get("format") != BPE_FORMAT:
            raise ValueError(f"not a BPE tokenizer (expected format {BPE_FORMAT!r})")
        text = data.get("tokenizer_json")
        if not isinstance(text, str):
            raise ValueError("a BPE tokenizer's dict needs its tokenizer.json text under 'tokenizer_json'")
        return cls(text)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BPETokenizer) and self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __reduce__(self) -> tuple:
        return BPETokenizer, (self._json,)  # the ``encode_special_tokens`` flag is set again on load

    def __repr__(self) -> str:
        return f"BPETokenizer(vocab_size={self.vocab_size})"


def train_bpe(texts: Iterable[str], vocab_size: int) -> BPETokenizer:
    """A byte-level BPE of ``vocab_size`` ids (specials and the 256 bytes included) trained on ``texts``.

    Merges need a pair seen twice; the same texts give the same tokenizer.

    :param texts: the training texts, each pre-tokenized on its own (GPT-2's split: words, numbers, punctuation
        runs, whitespace runs)
    :param vocab_size: at least ``259`` (the specials and the bytes)
    """
    tk = _tokenizers()
    if vocab_size < len(SPECIALS) + 256:
        raise ValueError(f"vocab_size must be at least {len(SPECIALS) + 256} (the specials and the 256 bytes)")
    hf = tk.Tokenizer(tk.models.BPE())
    hf.pre_tokenizer = tk.pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    hf.decoder = tk.decoders.ByteLevel()
    trainer = tk.trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=2, show_progress=False,
                                     special_tokens=list(SPECIALS),
                                     initial_alphabet=tk.pre_tokenizers.ByteLevel.alphabet())
    hf.train_from_iterator(list(texts), trainer=trainer)
    return BPETokenizer(hf.to_str())


def _tokenizers() -> Any:
    try:
        import tokenizers
    except ImportError:
        raise ImportError("a BPE tokenizer needs the tokenizers package: pip install -e . (a main dependency) "
                          "or make venv") from None
    return tokenizers


register_tokenizer_format(BPE_FORMAT, BPETokenizer.from_dict)
