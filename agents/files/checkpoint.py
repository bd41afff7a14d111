"""Model files that never execute code.

A saved TokenPPO / Reinforce keeps Stable-Baselines3's zip layout — ``data``, ``policy.pth``,
``policy.optimizer.pth``, ``pytorch_variables.pth``, ``_stable_baselines3_version``,
``system_info.txt`` — with two differences, both for safety:

* ``data`` is plain JSON written by this module: the constructor arguments, the policy's
  tokenizer and model config, the spaces and the training counters. SB3 would also store
  cloudpickled objects there (``:serialized:`` entries: the policy class, spaces, schedules),
  which its ``load`` unpickles — i.e. runs — on reading. Such entries are refused here.
* Every ``.pth`` entry holds tensors and plain containers only and is read with
  ``torch.load(weights_only=True)``, which refuses any other pickled object.

Sizes are checked before anything is read: the whole file, each entry's declared size, and
the bytes actually decompressed. Every problem is a one-line ``ValueError``.

As in SB3's ``save_util``, this module knows no algorithm: the algorithm assembles the plain
``data`` and its state dicts (``params``) and hands them to :func:`write`; :func:`read` returns them
checked, and the algorithm rebuilds itself from them
(:meth:`agents.algorithms.on_policy.TokenOnPolicyAlgorithm.load`). The helpers below turn the
values an algorithm holds (schedules, optimizer classes, spaces) into JSON data and back.

Where it differs from SB3: ``stable_baselines3``'s own ``BaseAlgorithm.load`` cannot rebuild
these files (there is no pickled policy class to read), and a learning-rate or clip-range
*schedule* is saved as its starting value (a warning says so; ``bugfix-gym train --resume`` sets the
run's schedule again).
"""

from __future__ import annotations

import copy
import dataclasses
import io
import json
import os
import pathlib
import platform
import tempfile
import warnings
import zipfile
import zlib
from typing import Any, BinaryIO, Callable

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule

from bugfix_gym.contract.text import printable
from bugfix_gym.contract.spaces import BufferedText

from agents.model.hf_adapter import MAX_CONFIG_BYTES, MAX_HF_BUFFER_BYTES, check_hf_config, meta_model_size
from agents.model.tinyagent import TinyAgent, TinyAgentConfig

FORMAT = "bugfix_gym.token_algorithm/2"
MiB = 1 << 20
MAX_FILE_BYTES = 512 * MiB
#: the entries a model file may hold, and the most bytes each may decompress to
ENTRY_LIMITS = {
    "data": 8 * MiB,
    "policy.pth": 128 * MiB,
    "policy.optimizer.pth": 256 * MiB,
    "ref_model.pth": 128 * MiB,
    "pytorch_variables.pth": 1 * MiB,
    "_stable_baselines3_version": 1024,
    "system_info.txt": 64 * 1024,
}
DATA_FIELDS = {"algorithm": str, "args": dict, "policy_kwargs": dict, "spaces": dict, "counters": dict}
PARAM_ENTRIES = {"policy.pth": "policy", "policy.optimizer.pth": "policy.optimizer", "ref_model.pth": "ref_model"}
OPTIMIZERS = {name: getattr(th.optim, name) for name in ("Adam", "AdamW", "SGD", "RMSprop")}


@dataclasses.dataclass
class ModelFile:
    """What :func:`read` found: the JSON ``data`` and the state dicts (``policy``,
    ``policy.optimizer``, optionally ``ref_model``), and the file's name for messages."""

    data: dict[str, Any]
    params: dict[str, dict[str, Any]]
    name: str = "the model file"


class ModelFileError(ValueError):
    """A model file that cannot be loaded safely; the message is one line."""


# ---------------------------------------------------------------------- writing
def write(path: str | pathlib.Path | io.BufferedIOBase, data: dict[str, Any], params: dict[str, dict[str, Any]]
          ) -> None:
    """Write a model file: SB3's ``save_to_zip_file`` without pickles.

    :param path: a path (``.zip`` is added to one without a suffix; folders are created) or a binary file object
    :param data: the algorithm's plain data (JSON: what :func:`plain` returns), stamped here with :data:`FORMAT`
    :param params: state dicts by :data:`PARAM_ENTRIES` key (``policy``, ``policy.optimizer``, ``ref_model``)
    """
    text = json.dumps({"format": FORMAT, **data}, allow_nan=False)
    if isinstance(path, (str, pathlib.Path)):
        path = pathlib.Path(path)
        if not path.suffix:
            path = path.with_suffix(".zip")
        path.parent.mkdir(parents=True, exist_ok=True)
    from stable_baselines3 import __version__ as sb3_version

    blobs = {entry: _tensor_bytes(params[key]) for entry, key in PARAM_ENTRIES.items() if key in params}
    for entry, blob in blobs.items():
        if len(blob) > ENTRY_LIMITS[entry]:  # read() would refuse the file: say so now, before writing it
            raise ValueError(f"the {PARAM_ENTRIES[entry]} weights take {len(blob)} bytes, more than a model file's "
                             f"{entry} holds ({ENTRY_LIMITS[entry]}): save a large HF model with "
                             "model.policy.model.lm.save_pretrained(DIR) instead")
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", text)
        for entry, blob in blobs.items():
            archive.writestr(entry, blob)
        archive.writestr("pytorch_variables.pth", _tensor_bytes({}))
        archive.writestr("_stable_baselines3_version", sb3_version)
        archive.writestr("system_info.txt", f"Python: {platform.python_version()}\nPyTorch: {th.__version__}\n"
                                            f"Format: {FORMAT}\n")


def _tensor_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    th.save(obj, buf)
    return buf.getvalue()


def saved_value(value: Any, name: str) -> Any:
    """A constructor argument as JSON data; an SB3 schedule becomes its starting value (with a warning
    for a real schedule, which a model file cannot keep).

    :param value: the argument's value
    :param name: its name, for messages
    """
    if isinstance(value, FloatSchedule):
        value = value.value_schedule
    if isinstance(value, ConstantSchedule):
        value = value.val
    if callable(value):  # a real schedule: its value at the start (a decayed one can be 0, not a valid rate)
        warnings.warn(f"{name} is a schedule; the model file keeps its starting value only", stacklevel=6)
        value = float(value(1.0))
    return plain(value, name)


def policy_kwargs_to_json(kwargs: dict[str, Any]) -> dict[str, Any]:
    """The policy's keyword arguments as JSON data (an ``optimizer_class`` by its name)."""
    out = dict(kwargs)
    cls = out.get("optimizer_class")
    if cls is not None:
        if OPTIMIZERS.get(getattr(cls, "__name__", "")) is not cls:
            raise ValueError(f"cannot save optimizer_class {cls!r}: model files keep one of {sorted(OPTIMIZERS)}")
        out["optimizer_class"] = getattr(cls, "__name__")
    return {k: plain(v, f"policy_kwargs[{k!r}]") for k, v in out.items()}


def policy_kwargs_from_json(kwargs: dict[str, Any], name: str) -> dict[str, Any]:
    """What :func:`policy_kwargs_to_json` wrote, with the ``optimizer_class`` looked up again.

    :param kwargs: the file's ``policy_kwargs``
    :param name: the file's name, for messages
    """
    out = dict(kwargs)
    if "optimizer_class" in out:
        opt = OPTIMIZERS.get(str(out["optimizer_class"]))
        if opt is None:
            raise ModelFileError(f"{name}: unknown optimizer_class {str(out['optimizer_class'])[:40]!r}")
        out["optimizer_class"] = opt
    return out


def plain(value: Any, where: str) -> Any:
    """``value`` as JSON data (tuples become lists), or a one-line error."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [plain(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: plain(v, where) for k, v in value.items()}
    raise ValueError(f"cannot save {where}: {type(value).__name__} is not plain data (numbers, strings, lists, dicts)")


def space_to_json(space: spaces.Space | None) -> dict[str, Any] | None:
    """A text space as JSON (the only kind the token algorithms train on); its characters sorted, so
    the same model writes the same file."""
    if space is None:
        return None
    if isinstance(space, spaces.Text):
        return {"type": "Text", "min_length": space.min_length, "max_length": space.max_length,
                "charset": "".join(sorted(space.character_set))}
    raise ValueError(f"cannot save a {type(space).__name__} space; the token algorithms act in Text spaces")


def space_from_json(data: Any) -> spaces.Space | None:
    """What :func:`space_to_json` wrote, as the text space the env uses."""
    if data is None:
        return None
    if not isinstance(data, dict) or data.get("type") != "Text":
        raise ModelFileError("unknown space description in the model file")
    try:
        return BufferedText(int(data["max_length"]), min_length=int(data["min_length"]), charset=str(data["charset"]))
    except (KeyError, TypeError, ValueError) as e:
        raise ModelFileError(f"bad space description in the model file ({type(e).__name__})") from None


# ---------------------------------------------------------------------- reading
def read(path: str | pathlib.Path | io.BufferedIOBase) -> ModelFile:
    """Read and check a model file without executing anything in it.

    :raises FileNotFoundError: neither ``path`` nor ``path.zip`` exists
    :raises ModelFileError: (a ``ValueError``) corrupt, oversized, foreign or unsafe content
    """
    name = str(path) if isinstance(path, (str, pathlib.Path)) else "the model file"
    source: Any = path
    if isinstance(path, (str, pathlib.Path)):
        p = pathlib.Path(path)
        if not p.exists() and pathlib.Path(str(p) + ".zip").exists():
            p = pathlib.Path(str(p) + ".zip")
        if not p.exists():
            raise FileNotFoundError(f"no model file at {path}")
        if not p.is_file():
            raise ModelFileError(f"{path} is not a model file (it is a directory or a device)")
        if p.stat().st_size > MAX_FILE_BYTES:
            raise ModelFileError(f"{path} is larger than {MAX_FILE_BYTES // MiB} MiB; not a bugfix-gym model file")
        source = p
    _check_entry_count(source, name)  # before zipfile reads every name of the central directory
    try:
        with zipfile.ZipFile(source) as archive:
            entries = {info.filename: info for info in archive.infolist()}
            unknown = sorted(set(entries) - set(ENTRY_LIMITS))
            if unknown:
                raise ModelFileError(f"{name} is not a bugfix-gym model file: unexpected entry {unknown[0]!r}")
            if "data" not in entries or "policy.pth" not in entries:
                raise ModelFileError(f"{name} is not a complete bugfix-gym model file: it needs 'data' and "
                                     "'policy.pth'")
            raw = {key: _read_entry(archive, entries[key], name) for key in entries}
    except (zipfile.BadZipFile, zlib.error) as e:
        raise ModelFileError(f"{name} is not a bugfix-gym model file: corrupt or not a zip archive ({e})") from None
    except (OSError, EOFError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as e:
        raise ModelFileError(f"{name} cannot be read: {type(e).__name__}: "
                             f"{printable(str(e).splitlines()[0], 200) if str(e) else ''}") from None
    data = _parse_data(raw["data"], name)
    _check_model_config(data, len(raw["policy.pth"]), name)  # before any tensor is built
    params = {key: _load_tensors(raw[entry], entry, name) for entry, key in PARAM_ENTRIES.items() if entry in raw}
    if "pytorch_variables.pth" in raw:  # unused here, but checked like the others: nothing unpickles
        _load_tensors(raw["pytorch_variables.pth"], "pytorch_variables.pth", name)
    _check_params(params, name)
    return ModelFile(data, params, name)


def _check_entry_count(source: Any, name: str) -> None:
    """Refuse a zip whose end-of-central-directory record declares more entries (or a larger directory) than
    a model file has, or a ZIP64 one, reading only the file's last 64 KiB."""
    tail_size = 65536 + 22
    try:
        if isinstance(source, pathlib.Path):
            with source.open("rb") as f:
                f.seek(max(0, source.stat().st_size - tail_size))
                tail = f.read()
        elif hasattr(source, "seek") and source.seekable():
            here = source.tell()
            source.seek(0, io.SEEK_END)
            source.seek(max(0, source.tell() - tail_size))
            tail = source.read()
            source.seek(here)
        else:
            return
    except OSError:
        return  # zipfile says what is wrong
    at = tail.rfind(b"PK\x05\x06")
    if at < 0 or len(tail) < at + 22:
        return  # not a zip: zipfile says so
    entries = int.from_bytes(tail[at + 10:at + 12], "little")
    directory_bytes = int.from_bytes(tail[at + 12:at + 16], "little")
    if entries > len(ENTRY_LIMITS) or directory_bytes > 64 * 1024:
        raise ModelFileError(f"{name} is not a bugfix-gym model file: its zip declares {entries} entries in "
                             f"{directory_bytes} bytes (a model file has at most {len(ENTRY_LIMITS)})")


def _read_entry(archive: zipfile.ZipFile, info: zipfile.ZipInfo, name: str) -> bytes:
    limit = ENTRY_LIMITS[info.filename]
    if info.file_size > limit:
        raise ModelFileError(f"{name}: entry {info.filename!r} declares {info.file_size} bytes, more than the "
                             f"{limit} allowed")
    with archive.open(info) as f:
        blob = f.read(limit + 1)  # a lying header cannot make us read more
    if len(blob) > limit:
        raise ModelFileError(f"{name}: entry {info.filename!r} is larger than the {limit} bytes allowed")
    return blob


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def _parse_data(blob: bytes, name: str) -> dict[str, Any]:
    try:
        data = json.loads(blob.decode("utf-8"), parse_constant=_no_constant)  # Infinity, NaN: refused
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ModelFileError(f"{name}: its 'data' entry is not JSON ({type(e).__name__})") from None
    if not isinstance(data, dict):
        raise ModelFileError(f"{name}: its 'data' entry is not a JSON object")
    if _has_serialized(data):
        raise ModelFileError(f"{name} holds pickled ':serialized:' objects (an SB3 save or an older bugfix-gym "
                             "format); refusing to unpickle them: re-train, or load it with SB3 only if you trust it")
    if data.get("format") != FORMAT:
        raise ModelFileError(f"{name} is not a bugfix-gym model file (format {str(data.get('format'))[:40]!r}, "
                             f"expected {FORMAT!r})")
    for key, kind in DATA_FIELDS.items():
        if not isinstance(data.get(key), kind):
            raise ModelFileError(f"{name}: its 'data' entry has no {key!r} {kind.__name__}")
    if not isinstance(data.get("state", {}), (dict, type(None))):
        raise ModelFileError(f"{name}: its 'data' entry's 'state' is not an object")
    if not all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63 for v in data["counters"].values()):
        raise ModelFileError(f"{name}: its training counters are not whole numbers from 0 to 2**63")
    return data


def estimated_parameters(config: dict[str, Any]) -> int:
    """The parameter count a TinyAgent config asks for (embeddings, blocks, heads), from its sizes alone.

    :param config: ``policy_kwargs["model_config"]`` of a model file
    """
    v, d, f, t, n = (int(config.get(k, getattr(TinyAgentConfig, k))) for k in
                     ("vocab_size", "d_model", "d_ff", "max_len", "n_layer"))
    return v * d + t * d + n * (4 * d * d + 2 * d * f + 4 * d) + d  # the output head shares the embedding


#: the sizes an HF decoder config names, each under the names configs give it (Llama / GPT-2 / OPT style)
HF_SIZES = {"vocab": ("vocab_size",), "hidden": ("hidden_size", "n_embd", "d_model"),
            "mlp": ("intermediate_size", "n_inner", "ffn_dim"),
            "layers": ("num_hidden_layers", "n_layer", "num_layers")}


def _hf_size(config: dict[str, Any], size: str) -> int:
    """The first of a size's names that an HF config sets (0 if none)."""
    return next((int(config[k]) for k in HF_SIZES[size] if config.get(k) is not None), 0)


def estimated_hf_parameters(config: dict[str, Any]) -> int:
    """A lower bound on the parameters an HF causal-LM config asks for, from the sizes every decoder
    config names: the embedding, and per layer the query and output projections and two MLP matrices
    (grouped-query attention, tied heads and gated MLPs only add to it).

    :param config: ``policy_kwargs["hf_config"]`` of a model file
    """
    v, h, f, n = (_hf_size(config, size) for size in ("vocab", "hidden", "mlp", "layers"))
    return v * h + n * (2 * h * h + 2 * h * f)


def _check_hf_config(config: Any, policy_bytes: int, name: str) -> None:
    """An HF config must be a bounded JSON object whose sizes are whole numbers and whose fields build a model
    (:func:`agents.model.hf_adapter.check_hf_config`), asking for no more parameters than ``policy.pth``
    holds at 2 bytes a parameter (bf16, the smallest dtype trained): first a lower bound from the sizes every
    decoder config names (:func:`estimated_hf_parameters`), then, where transformers is installed, the exact
    count of the model built on the meta device (:func:`agents.model.hf_adapter.meta_model_size`: learned
    positions, experts and untied heads included), all before anything is allocated."""
    if not isinstance(config, dict):
        raise ModelFileError(f"{name}: its hf_config is not an object")
    if len(json.dumps(config)) > MAX_CONFIG_BYTES:
        raise ModelFileError(f"{name}: its hf_config takes more than {MAX_CONFIG_BYTES} bytes")
    for key in [k for names in HF_SIZES.values() for k in names if config.get(k) is not None]:
        value = config[key]
        if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= 2**24:
            raise ModelFileError(f"{name}: its hf_config {key} is {printable(repr(value), 40)}, not a whole "
                                 f"number from 0 to {2**24}")
    if estimated_hf_parameters(config) * 2 > policy_bytes + MiB:
        raise ModelFileError(f"{name}: its hf_config asks for at least {estimated_hf_parameters(config)} parameters, "
                             f"more than its {policy_bytes}-byte policy.pth can hold")
    try:
        check_hf_config(config)
    except ValueError as e:
        raise ModelFileError(f"{name}: {e}") from None
    try:
        import transformers  # noqa: F401 - without it the model cannot be built at all (one line later)
    except ImportError:
        return
    try:
        params, buffer_bytes = meta_model_size(config)  # every parameter counted, nothing allocated
    except ValueError as e:
        raise ModelFileError(f"{name}: {e}") from None
    if params * 2 > policy_bytes + MiB:
        raise ModelFileError(f"{name}: its hf_config builds a model of {params} parameters, more than its "
                             f"{policy_bytes}-byte policy.pth can hold")
    if buffer_bytes > MAX_HF_BUFFER_BYTES:
        raise ModelFileError(f"{name}: its hf_config's model would allocate {buffer_bytes} bytes of buffers, more "
                             f"than {MAX_HF_BUFFER_BYTES}")


def _check_model_config(data: dict[str, Any], policy_bytes: int, name: str) -> None:
    """Refuse sizes that are not positive whole numbers, or that ask for more parameters than the
    ``policy.pth`` entry (4 bytes a parameter) holds, before anything is allocated."""
    if "hf_config" in data["policy_kwargs"] and data["policy_kwargs"]["hf_config"] is not None:
        _check_hf_config(data["policy_kwargs"]["hf_config"], policy_bytes, name)
    config = data["policy_kwargs"].get("model_config")
    if config is None:
        return
    if not isinstance(config, dict):
        raise ModelFileError(f"{name}: its model_config is not an object")
    for key in ("vocab_size", "d_model", "n_layer", "n_head", "d_ff", "max_len"):
        value = config.get(key, getattr(TinyAgentConfig, key))
        if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= 2**20:
            raise ModelFileError(f"{name}: its model_config {key} is {printable(repr(value), 40)}, not a whole "
                                 f"number from 1 to {2**20}")
    if config.get("d_model", TinyAgentConfig.d_model) % config.get("n_head", TinyAgentConfig.n_head):
        raise ModelFileError(f"{name}: its model_config d_model is not divisible by n_head")
    if estimated_parameters(config) * 4 > policy_bytes + MiB:
        raise ModelFileError(f"{name}: its model_config asks for {estimated_parameters(config)} parameters, more "
                             f"than its {policy_bytes}-byte policy.pth can hold")


def _check_params(params: dict[str, dict[str, Any]], name: str) -> None:
    """The weights' names are text and every floating-point tensor is finite."""
    for key in ("policy", "ref_model"):
        state = params.get(key, {})
        if not all(isinstance(k, str) and isinstance(t, th.Tensor) for k, t in state.items()):
            raise ModelFileError(f"{name}: its {key} weights are not a map from names to tensors")
        for k, t in state.items():
            if t.is_floating_point() and not bool(th.isfinite(t).all()):
                raise ModelFileError(f"{name}: its {key} weight {printable(k, 60)!r} holds NaN or infinite values")
    optimizer = params.get("policy.optimizer")
    if optimizer is not None and not (isinstance(optimizer.get("state"), dict)
                                      and isinstance(optimizer.get("param_groups"), list)):
        raise ModelFileError(f"{name}: its optimizer state is not an optimizer state dict")


def _has_serialized(obj: Any, depth: int = 0) -> bool:
    if depth > 64:
        return True  # absurd nesting: treat as unsafe
    if isinstance(obj, dict):
        return ":serialized:" in obj or any(_has_serialized(v, depth + 1) for v in obj.values())
    if isinstance(obj, list):
        return any(_has_serialized(v, depth + 1) for v in obj)
    return False


def _load_tensors(blob: bytes, entry: str, name: str) -> dict[str, Any]:
    try:
        obj = th.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - the unpickler refuses anything but tensors and plain containers
        first = printable(str(e).splitlines()[0], 160) if str(e) else type(e).__name__
        raise ModelFileError(f"{name}: entry {entry!r} is not a plain tensor file ({first})") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{name}: entry {entry!r} is not a state dict")
    return obj


# ---------------------------------------------------------------------- weights files and snapshots
def load_state_dict_file(path: str | pathlib.Path, expected_format: str | None = None) -> TinyAgent:
    """A TinyAgent from a ``.pt`` file holding ``{"config": {...}, "state_dict": {...}}`` (e.g. a cached
    base agent), read with ``weights_only=True``.

    :param path: the file
    :param expected_format: if given, the file's ``"format"`` entry must be this
    :raises FileNotFoundError: no such file
    :raises ModelFileError: a corrupt, foreign or unsafe file (one line, naming the cause's type)
    """
    try:
        blob = th.load(path, map_location="cpu", weights_only=True)
        if expected_format is not None and blob.get("format") != expected_format:
            raise ValueError(f"not format {expected_format}")
        model = TinyAgent(TinyAgentConfig(**blob["config"]))
        model.load_state_dict(blob["state_dict"])
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - one line for any corrupt / foreign file
        raise ModelFileError(f"{path} is not a TinyAgent weights file with a config ({type(e).__name__})") from None
    return model


def save_state_dict_file(path: pathlib.Path, model: TinyAgent, file_format: str) -> None:
    """Write what :func:`load_state_dict_file` reads, atomically (:func:`atomic_write`).

    :param path: the file (its folder is created)
    :param model: the TinyAgent
    :param file_format: the ``"format"`` entry, checked again on reading
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, lambda f: th.save({"format": file_format, "config": dataclasses.asdict(model.config),
                                          "state_dict": model.state_dict()}, f))


def atomic_write(path: pathlib.Path, write: Callable[[BinaryIO], Any]) -> None:
    """Write a file through a temporary neighbour of its own and ``os.replace``: readers (and
    concurrent writers) never see half a file, and a failure leaves no temporary file behind.

    :param path: the file to (re)write; its folder must exist
    :param write: writes the content to the binary file object it is given
    """
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_regular(path: pathlib.Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as a regular file, never through a symbolic link and never into a FIFO or a
    device: opened with ``O_NOFOLLOW`` (a link at ``path`` is ``ELOOP``) and ``O_NONBLOCK`` (a FIFO without a
    reader is ``ENXIO``, never a wait), and checked with ``fstat`` before anything is written or truncated.

    :param path: the file (created, or replaced in place if it is a regular file)
    :param data: the bytes
    :raises OSError: it cannot be written (its ``strerror`` says why; ``not a regular file`` for a FIFO, a
        device or a folder)
    """
    import errno
    import stat

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, a device or a folder)", str(path))
        os.ftruncate(fd, 0)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def why_not_writable(err: OSError) -> str:
    """An ``OSError`` of :func:`write_regular` in words (a link is named as one)."""
    import errno

    if err.errno == errno.ELOOP:
        return "it is a symbolic link; give the file itself"
    if err.errno == errno.ENXIO:
        return "it is a FIFO with no reader; give a regular file"
    return err.strerror or type(err).__name__


class ParameterSnapshot:
    """A copy, in memory, of a policy's parameters and (by default) its optimizer's state: taken before
    an update that may diverge, at the start of an iteration, or of weights worth keeping.

    :param policy: an SB3 policy (with an ``optimizer`` unless ``with_optimizer`` is False)
    :param with_optimizer: also copy the optimizer's state
    """

    def __init__(self, policy: th.nn.Module, with_optimizer: bool = True):
        self.policy = policy
        self.params = copy.deepcopy(policy.state_dict())
        optimizer: Any = policy.optimizer if with_optimizer else None
        self.optimizer = copy.deepcopy(optimizer.state_dict()) if optimizer is not None else None

    def restore(self) -> None:
        """Put the copied parameters (and optimizer state) back into the policy."""
        self.policy.load_state_dict(self.params)
        if self.optimizer is not None:
            self.policy.optimizer.load_state_dict(self.optimizer)  # type: ignore[union-attr]
