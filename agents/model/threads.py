"""How many torch threads the tiny model's work runs under.

TinyAgent has ~150k parameters: its matrix products are too small to split well, and on a
small CPU several intra-op threads run it slower than one (docs/ppo.md, "Threads"). The
algorithms therefore run their work (building the model, ``learn``, sampling, ``predict``) under
:func:`torch_threads`, which sets the thread count for the duration of that work only and puts
the caller's count back afterwards.

The ``"auto"`` setting picks :data:`AUTO_THREADS` on a CPU device unless the user has chosen a
count: ``OMP_NUM_THREADS`` or ``MKL_NUM_THREADS`` set, or ``torch.set_num_threads`` called since
this module was imported (a count set before ``agents`` was imported cannot be told apart from
torch's default: pass that count, or None, explicitly).
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator, Union

import torch

#: what ``"auto"`` runs the model's work under on a CPU: one thread (docs/ppo.md, "Threads")
AUTO_THREADS = 1
#: the environment variables by which a user chooses torch's thread count
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")
#: torch's thread count when this module was imported (taken as torch's default)
_TORCH_DEFAULT = torch.get_num_threads()

ThreadSetting = Union[int, str, None]


def check_thread_setting(setting: ThreadSetting) -> ThreadSetting:
    """``setting`` if it is ``"auto"``, None or a positive int, else a one-line ``ValueError``."""
    if setting is None or setting == "auto" or (isinstance(setting, int) and not isinstance(setting, bool)
                                                and setting >= 1):
        return setting
    raise ValueError(f"torch_threads must be 'auto', None (leave torch's count alone) or a count >= 1, "
                     f"got {setting!r}")


def resolve_threads(setting: ThreadSetting, device: torch.device | str = "cpu") -> int | None:
    """The thread count to run the model's work under, or None to leave torch's count as it is.

    :param setting: ``"auto"`` (:data:`AUTO_THREADS` on a CPU unless the user chose a count, see the
        module docstring), None (leave it) or a count
    :param device: the model's device (``"auto"`` leaves the count alone off the CPU)
    """
    check_thread_setting(setting)
    if setting != "auto":
        return setting  # type: ignore[return-value]
    if torch.device(device).type != "cpu" or any(os.environ.get(name) for name in THREAD_ENV_VARS):
        return None
    if torch.get_num_threads() != _TORCH_DEFAULT:  # the user called torch.set_num_threads
        return None
    return AUTO_THREADS


@contextlib.contextmanager
def use_threads(setting: ThreadSetting, device: torch.device | str = "cpu") -> Iterator[None]:
    """Run the block under :func:`resolve_threads`' count, then put the caller's count back.

    :param setting: ``"auto"``, None or a count (:func:`resolve_threads`)
    :param device: the model's device
    """
    n = resolve_threads(setting, device)
    before = torch.get_num_threads()
    if n is None or n == before:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)
