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

Where it differs from SB3: ``stable_baselines3``'s own ``BaseAlgorithm.load`` cannot rebuild
these files (there is no pickled policy class to read), and a learning-rate or clip-range
*schedule* is saved as its starting value (a warning says so; ``bugfix-gym train --resume`` sets the
run's schedule again).
"""

from __future__ import annotations

import copy
import io
import json
import pathlib
import platform
import warnings
import zipfile
import zlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.utils import ConstantSchedule, FloatSchedule

from bugfix_gym.spaces import BufferedText

from agents.model.tinyagent import TinyAgent, TinyAgentConfig

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm

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
PARAM_ENTRIES = {"policy.pth": "policy", "policy.optimizer.pth": "policy.optimizer", "ref_model.pth": "ref_model"}
OPTIMIZERS = {name: getattr(th.optim, name) for name in ("Adam", "AdamW", "SGD", "RMSprop")}


@dataclass
class ModelFile:
    """What :func:`read` found: the JSON ``data`` and the state dicts (``policy``,
    ``policy.optimizer``, optionally ``ref_model``)."""

    data: dict[str, Any]
    params: dict[str, dict[str, Any]]


class ModelFileError(ValueError):
    """A model file that cannot be loaded safely; the message is one line."""


# ---------------------------------------------------------------------- writing
def save(algo: "TokenOnPolicyAlgorithm", path: str | pathlib.Path | io.BufferedIOBase) -> None:
    """Write ``algo`` to ``path`` (``.zip`` is added to a path without a suffix) or a binary file object."""
    data = {
        "format": FORMAT,
        "algorithm": type(algo).__name__,
        "args": {name: _json_arg(name, value) for name, value in algo.saved_settings().items()},
        "seed": algo.seed,
        "policy_kwargs": _json_policy_kwargs(algo.policy_kwargs),
        "spaces": {"observation": space_to_json(algo.observation_space), "action": space_to_json(algo.action_space)},
        "counters": {"num_timesteps": int(algo.num_timesteps), "n_updates": int(algo._n_updates),
                     "iteration": int(algo._iteration), "total_policy_tokens": int(algo.total_policy_tokens)},
        "state": algo._extra_state(),
    }
    text = json.dumps(data, allow_nan=False)
    params = {"policy": algo.policy.state_dict(), "policy.optimizer": algo.policy.optimizer.state_dict()}
    ref = getattr(algo, "ref_model", None)
    if ref is not None:
        params["ref_model"] = ref.state_dict()
    if isinstance(path, (str, pathlib.Path)):
        path = pathlib.Path(path)
        if not path.suffix:
            path = path.with_suffix(".zip")
        path.parent.mkdir(parents=True, exist_ok=True)
    from stable_baselines3 import __version__ as sb3_version

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        archive.writestr("data", text)
        for entry, key in PARAM_ENTRIES.items():
            if key in params:
                archive.writestr(entry, _tensor_bytes(params[key]))
        archive.writestr("pytorch_variables.pth", _tensor_bytes({}))
        archive.writestr("_stable_baselines3_version", sb3_version)
        archive.writestr("system_info.txt", f"Python: {platform.python_version()}\nPyTorch: {th.__version__}\n"
                                            f"Format: {FORMAT}\n")


def _tensor_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    th.save(obj, buf)
    return buf.getvalue()


def _json_arg(name: str, value: Any) -> Any:
    if isinstance(value, FloatSchedule):
        value = value.value_schedule
    if isinstance(value, ConstantSchedule):
        value = value.val
    if callable(value):  # a real schedule: its value at the start (a decayed one can be 0, not a valid rate)
        warnings.warn(f"{name} is a schedule; the model file keeps its starting value only", stacklevel=3)
        value = float(value(1.0))
    return _plain(value, name)


def _json_policy_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    out = dict(kwargs)
    cls = out.get("optimizer_class")
    if cls is not None:
        if OPTIMIZERS.get(getattr(cls, "__name__", "")) is not cls:
            raise ValueError(f"cannot save optimizer_class {cls!r}: model files keep one of {sorted(OPTIMIZERS)}")
        out["optimizer_class"] = getattr(cls, "__name__")
    return {k: _plain(v, f"policy_kwargs[{k!r}]") for k, v in out.items()}


def _plain(value: Any, where: str) -> Any:
    """``value`` as JSON data (tuples become lists), or a one-line error."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v, where) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v, where) for k, v in value.items()}
    raise ValueError(f"cannot save {where}: {type(value).__name__} is not plain data (numbers, strings, lists, dicts)")


def space_to_json(space: spaces.Space | None) -> dict[str, Any] | None:
    """A text space as JSON (the only kind the token algorithms train on)."""
    if space is None:
        return None
    if isinstance(space, spaces.Text):
        return {"type": "Text", "min_length": space.min_length, "max_length": space.max_length,
                "charset": "".join(space.character_set)}
    raise ValueError(f"cannot save a {type(space).__name__} space; the token algorithms act in Text spaces")


def space_from_json(data: Any) -> spaces.Space | None:
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
        raise ModelFileError(f"{name} cannot be read: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                             ) from None
    data = _parse_data(raw["data"], name)
    params = {key: _load_tensors(raw[entry], entry, name) for entry, key in PARAM_ENTRIES.items() if entry in raw}
    if "pytorch_variables.pth" in raw:  # unused here, but checked like the others: nothing unpickles
        _load_tensors(raw["pytorch_variables.pth"], "pytorch_variables.pth", name)
    return ModelFile(data, params)


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


def _parse_data(blob: bytes, name: str) -> dict[str, Any]:
    try:
        data = json.loads(blob.decode("utf-8"))
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
    for key in ("algorithm", "args", "policy_kwargs", "spaces", "counters"):
        if key not in data:
            raise ModelFileError(f"{name}: its 'data' entry has no {key!r}")
    return data


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
        first = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise ModelFileError(f"{name}: entry {entry!r} is not a plain tensor file ({first})") from None
    if not isinstance(obj, dict):
        raise ModelFileError(f"{name}: entry {entry!r} is not a state dict")
    return obj


# ---------------------------------------------------------------------- loading
def load(cls: type["TokenOnPolicyAlgorithm"], path: str | pathlib.Path | io.BufferedIOBase, env: Any = None,
         device: th.device | str = "cpu", **overrides: Any) -> Any:
    """Rebuild an algorithm saved by :func:`save`: the constructor from ``data``, then the weights.

    :param cls: the algorithm class (its name must match the file's)
    :param path: the model file
    :param env: the env to continue with (its spaces must match the saved ones), or None
    :param device: torch device
    :param overrides: constructor arguments that replace the saved ones
    """
    mf = read(path)
    data, name = mf.data, str(path) if isinstance(path, (str, pathlib.Path)) else "the model file"
    if data["algorithm"] != cls.__name__:
        raise ModelFileError(f"{name} holds a {str(data['algorithm'])[:40]} model; load it with "
                             f"{str(data['algorithm'])[:40]}.load")
    args = cls.upgrade_saved_args(dict(data["args"]))
    unknown = sorted(set(args) - set(cls.saved_args))
    if unknown:
        raise ModelFileError(f"{name}: unknown argument {unknown[0]!r} for {cls.__name__}")
    args.update(overrides)
    policy_kwargs = dict(data["policy_kwargs"])
    if "optimizer_class" in policy_kwargs:
        opt = OPTIMIZERS.get(str(policy_kwargs["optimizer_class"]))
        if opt is None:
            raise ModelFileError(f"{name}: unknown optimizer_class {str(policy_kwargs['optimizer_class'])[:40]!r}")
        policy_kwargs["optimizer_class"] = opt
    obs_space = space_from_json(data["spaces"].get("observation"))
    act_space = space_from_json(data["spaces"].get("action"))
    if env is not None:
        env = cls._wrap_env(env, int(args.get("verbose", 0)))
        if env.observation_space != obs_space or env.action_space != act_space:
            raise ValueError(f"the env's spaces ({env.observation_space}, {env.action_space}) differ from the "
                             f"saved model's ({obs_space}, {act_space})")
    try:
        model = cls("TinyAgentPolicy", env=None, base_agent=None, policy_kwargs=policy_kwargs, seed=data.get("seed"),
                    device=device, _init_setup_model=False, **args)
        model.observation_space, model.action_space = obs_space, act_space  # type: ignore[assignment]
        model.n_envs = 1 if env is None else env.num_envs
        model._setup_model()
        model.policy.load_state_dict(mf.params["policy"])
        if "policy.optimizer" in mf.params:
            model.policy.optimizer.load_state_dict(mf.params["policy.optimizer"])
        ref = getattr(model, "ref_model", None)
        if ref is not None and "ref_model" in mf.params:
            ref.load_state_dict(mf.params["ref_model"])
        counters = data["counters"]
        model.num_timesteps = int(counters["num_timesteps"])
        model._n_updates = int(counters["n_updates"])
        model._iteration = int(counters["iteration"])
        model.total_policy_tokens = int(counters["total_policy_tokens"])
        model._set_extra_state(data.get("state") or {})
    except ModelFileError:
        raise
    except (KeyError, TypeError, ValueError, RuntimeError) as e:
        raise ModelFileError(f"{name} does not fit {cls.__name__}: {type(e).__name__}: "
                             f"{str(e).splitlines()[0][:200] if str(e) else ''}") from None
    if env is not None:
        model.set_env(env)
    return model


def load_state_dict_file(path: str | pathlib.Path) -> TinyAgent:
    """A TinyAgent from a ``.pt`` file holding ``{"config": {...}, "state_dict": {...}}`` (e.g. a cached
    base agent), read with ``weights_only=True``."""
    try:
        blob = th.load(path, map_location="cpu", weights_only=True)
        model = TinyAgent(TinyAgentConfig(**blob["config"]))
        model.load_state_dict(blob["state_dict"])
    except FileNotFoundError:
        raise
    except Exception as e:  # noqa: BLE001 - one line for any corrupt / foreign file
        raise ModelFileError(f"{path} is not a TinyAgent weights file with a config ({type(e).__name__})") from None
    return model


class ParameterSnapshot:
    """A copy of a policy's parameters and optimizer state, restored after a diverged update.

    :param policy: an SB3 policy with an ``optimizer``
    """

    def __init__(self, policy: th.nn.Module):
        self.policy = policy
        self.params = copy.deepcopy(policy.state_dict())
        self.optimizer = copy.deepcopy(policy.optimizer.state_dict())  # type: ignore[union-attr]

    def restore(self) -> None:
        self.policy.load_state_dict(self.params)
        self.policy.optimizer.load_state_dict(self.optimizer)  # type: ignore[union-attr]
