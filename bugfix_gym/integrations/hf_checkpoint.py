"""Hugging Face files read as data: a ``save_pretrained`` directory (``config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) or a lone ``tokenizer.json``.

Every file is read bounded (:func:`~bugfix_gym.integrations.bounded_json.read_bounded`: a regular file, at
most its limit), parsed as plain JSON, and checked before anything is built: the safetensors header's
dtypes, shapes and offsets must describe exactly the bytes that follow it. Nothing is loaded through
pickle, remote code or the network. :func:`read_tokenizer` gives a tokenizer for ``bugfix-gym conformance
--tokenizer``; :func:`read_checkpoint` gives the config, the tokenizer and the weights for ``bugfix-gym
serve DIR`` (which checks the config as it checks a model file's, ``agents.cli.serve.load_served``).
Needs ``tokenizers`` (and ``transformers`` for a chat template, ``torch`` for weights): ``.venv-trl``.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

MAX_TOKENIZER_JSON_BYTES = 16 << 20
"""The largest ``tokenizer.json`` read (a 150k-piece BPE's is about 11 MB)."""
MAX_SMALL_JSON_BYTES = 1 << 20
"""``config.json``, ``tokenizer_config.json``, ``chat_template.jinja``."""
MAX_WEIGHTS_BYTES = 128 << 20
"""``model.safetensors``: the limit of a model file's ``policy.pth`` (about 32M float32 or 64M bf16 parameters)."""
MAX_HEADER_BYTES = 8 << 20
#: safetensors dtype -> bytes per element (the dtypes a model file may hold)
SAFETENSORS_DTYPES = {"F32": 4, "BF16": 2, "F16": 2}


def _read(path: Path, limit: int, what: str) -> bytes:
    from .bounded_json import read_bounded

    try:
        return read_bounded(str(path), limit, what)
    except OSError as err:
        raise ValueError(f"cannot read {what} {path} ({err.strerror or err})") from None


def _json(path: Path, limit: int, what: str) -> Any:
    from .bounded_json import parse_json

    blob = _read(path, limit, what)
    try:
        text = blob.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{what} {path} is not UTF-8 text") from None
    if what == "tokenizer.json":  # deep merges lists nest past parse_json's limit: plain, finite JSON is enough
        try:
            return json.loads(text, parse_constant=_no_constant)
        except (ValueError, RecursionError):
            raise ValueError(f"{what} {path} is not JSON") from None
    try:
        return parse_json(text)
    except ValueError as err:
        raise ValueError(f"{what} {path} {err}") from None


def _no_constant(text: str) -> Any:
    raise ValueError(f"holds {text}")


class TextTokenizer:
    """A bare ``tokenizers.Tokenizer`` (a ``tokenizer.json`` without a chat template) as the conformance checks
    use a tokenizer: ``encode`` (no special tokens), ``decode`` (special tokens kept), ``eoc_id`` (the EOS the
    tokenizer names, else None).

    :param backend: the ``tokenizers.Tokenizer``
    :param eos: the EOS token's text, if known
    """

    def __init__(self, backend: Any, eos: str | None = None):
        self.backend = backend
        eos_id = backend.token_to_id(eos) if eos else None
        self.eoc_id = int(eos_id) if eos_id is not None else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(self.backend.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Iterable[int]) -> str:
        return str(self.backend.decode([int(i) for i in ids], skip_special_tokens=False))


def _special(value: Any) -> str | None:
    """A special token of ``tokenizer_config.json``: a string, or an ``AddedToken`` dict's ``content``."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_tokenizer(path: str | Path) -> Any:
    """The tokenizer at ``path``: a ``save_pretrained`` directory (with a chat template: a
    :class:`~bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`, whose end-of-turn id and tool suffix
    the checks read; without one: a :class:`TextTokenizer`) or a lone HF ``tokenizer.json``
    (a :class:`TextTokenizer`: give ``--end-ids``). A one-line ``ValueError`` for anything else.

    :param path: the directory or the file
    """
    path = Path(path)
    folder = path.is_dir()
    file = path / "tokenizer.json" if folder else path
    if folder and not file.exists():
        raise ValueError(f"{path} holds no tokenizer.json; give a save_pretrained folder, its tokenizer.json, or "
                         "the DUMP.tokenizer.json bugfix-gym train --dump wrote")
    data = _json(file, MAX_TOKENIZER_JSON_BYTES, "tokenizer.json")
    config = _json(path / "tokenizer_config.json", MAX_SMALL_JSON_BYTES, "tokenizer_config.json") \
        if folder and (path / "tokenizer_config.json").exists() else {}
    if not isinstance(config, dict):
        raise ValueError(f"{path / 'tokenizer_config.json'} is not a JSON object")
    template = config.get("chat_template")
    if folder and (path / "chat_template.jinja").exists():
        template = _read(path / "chat_template.jinja", MAX_SMALL_JSON_BYTES, "chat_template.jinja").decode(
            "utf-8", "replace")
    return tokenizer_of(data, config, template if isinstance(template, str) else None, str(file))


def tokenizer_of(data: Any, config: dict[str, Any], template: str | None, name: str) -> Any:
    """An HF tokenizer from ``tokenizer.json``'s data, ``tokenizer_config.json``'s special tokens and a chat
    template (see :func:`read_tokenizer`).

    :param data: ``tokenizer.json`` as JSON data
    :param config: ``tokenizer_config.json`` as JSON data (may be empty)
    :param template: the chat template, or None
    :param name: the file's name, for messages
    """
    if not isinstance(data, dict) or "model" not in data:
        raise ValueError(f"{name} is not a Hugging Face tokenizer.json (it has no 'model')")
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ValueError(f"{name} is a Hugging Face tokenizer; reading it needs tokenizers (and transformers for a "
                         "chat template): run this in .venv-trl (make trl-venv)") from None
    try:
        backend = Tokenizer.from_str(json.dumps(data))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - tokenizers raises its own types, and Rust panics
        raise ValueError(f"{name} does not load as a tokenizer ({type(err).__name__})") from None
    specials = {k: _special(config.get(k)) for k in ("eos_token", "pad_token", "unk_token", "bos_token")}
    if template is None:
        return TextTokenizer(backend, specials["eos_token"])
    try:
        from transformers import PreTrainedTokenizerFast
    except ImportError:
        raise ValueError(f"{name} has a chat template; reading it needs transformers: run this in .venv-trl "
                         "(make trl-venv)") from None
    from .hf_tokenizer import ChatTemplateTokenizer

    hf = PreTrainedTokenizerFast(tokenizer_object=backend, clean_up_tokenization_spaces=False,
                                 **{k: v for k, v in specials.items() if v})
    hf.chat_template = template
    return ChatTemplateTokenizer(hf)


@dataclass
class Checkpoint:
    """What :func:`read_checkpoint` read: the config (JSON data), the tokenizer, and the weights' file bytes
    with their checked header (:func:`weights`)."""

    path: Path
    config: dict[str, Any]
    tokenizer: Any
    weights_blob: bytes
    header: dict[str, Any]

    def weights(self) -> dict[str, Any]:
        """The state dict (``torch`` tensors), from the bytes already read and checked."""
        from safetensors.torch import load

        return load(self.weights_blob)


def check_safetensors(blob: bytes, name: str) -> dict[str, Any]:
    """The header of a ``.safetensors`` file's bytes, checked: an 8-byte length, that much JSON, each tensor a
    dtype of :data:`SAFETENSORS_DTYPES` with a shape of whole numbers whose bytes are exactly its
    ``data_offsets``, the tensors tiling the data that follows without a gap or an overlap.

    :param blob: the file's bytes
    :param name: the file, for messages
    :raises ValueError: one line
    """
    if len(blob) < 8:
        raise ValueError(f"{name} is {len(blob)} bytes, not a safetensors file")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > min(MAX_HEADER_BYTES, len(blob) - 8):
        raise ValueError(f"{name}: its header claims {size} bytes, more than the file holds; not a safetensors file")
    try:
        from .bounded_json import parse_json

        header = parse_json(blob[8:8 + size].decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{name}: its header is not JSON; not a safetensors file") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name}: its header is not a JSON object")
    data_bytes, spans = len(blob) - 8 - size, []
    for key, info in header.items():
        if key == "__metadata__":
            continue
        if not isinstance(info, dict) or info.get("dtype") not in SAFETENSORS_DTYPES:
            dtype = info.get("dtype") if isinstance(info, dict) else None
            raise ValueError(f"{name}: tensor {key[:60]!r} has dtype {str(dtype)[:10]!r}; a model may hold "
                             f"{', '.join(SAFETENSORS_DTYPES)}")
        shape, offsets = info.get("shape"), info.get("data_offsets")
        if not (isinstance(shape, list) and len(shape) <= 8
                and all(isinstance(d, int) and 0 <= d <= 2**31 for d in shape)):
            raise ValueError(f"{name}: tensor {key[:60]!r} has no shape of whole numbers")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)
                and 0 <= offsets[0] <= offsets[1] <= data_bytes):
            raise ValueError(f"{name}: tensor {key[:60]!r} lies outside the file's data")
        count = 1
        for d in shape:
            count *= d
        if count * SAFETENSORS_DTYPES[info["dtype"]] != offsets[1] - offsets[0]:
            raise ValueError(f"{name}: tensor {key[:60]!r} of shape {shape} takes {offsets[1] - offsets[0]} bytes, "
                             "not what its shape and dtype need")
        spans.append((offsets[0], offsets[1]))
    at = 0
    for start, end in sorted(spans):
        if start != at:
            raise ValueError(f"{name}: its tensors overlap or leave a gap at byte {at}")
        at = end
    if at != data_bytes:
        raise ValueError(f"{name}: {data_bytes - at} bytes after its last tensor")
    return header


def read_checkpoint(path: str | Path) -> Checkpoint:
    """A ``save_pretrained`` directory (a TRL or ``Trainer`` output is one): ``config.json``,
    ``model.safetensors`` and the tokenizer's files, each read bounded and checked (:func:`check_safetensors`);
    the config's own fields are the caller's to check (``agents.cli.serve.load_served`` checks them as it checks
    a model file's ``hf_config``). A one-line ``ValueError`` for anything missing or malformed.

    :param path: the directory
    """
    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"{path} is not a directory")
    if not (path / "config.json").exists():
        runs = sorted((p for p in path.glob("checkpoint-*") if p.is_dir() and p.name[11:].isdigit()),
                      key=lambda p: int(p.name[11:]))
        hint = f" (its latest checkpoint is {runs[-1]})" if runs else ""
        raise ValueError(f"{path} holds no config.json; give a save_pretrained folder{hint}")
    config = _json(path / "config.json", MAX_SMALL_JSON_BYTES, "config.json")
    if not isinstance(config, dict):
        raise ValueError(f"{path / 'config.json'} is not a JSON object")
    weights = path / "model.safetensors"
    if not weights.exists():
        found = ", ".join(sorted(p.name for p in path.iterdir() if p.suffix in (".bin", ".safetensors", ".pt")))
        also = f" (it has {found}; pickled weights are not read)" if found else ""
        raise ValueError(f"{path} holds no model.safetensors{also}; save the model with save_pretrained "
                         "(safe_serialization, one shard)")
    blob = _read(weights, MAX_WEIGHTS_BYTES, "model.safetensors")
    header = check_safetensors(blob, str(weights))
    tokenizer = read_tokenizer(path)
    if isinstance(tokenizer, TextTokenizer):
        raise ValueError(f"{path}'s tokenizer has no chat template (tokenizer_config.json's chat_template or "
                         "chat_template.jinja); serve renders chats with it")
    return Checkpoint(path, config, tokenizer, blob, header)
