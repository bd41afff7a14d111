"""A ``Text`` space that array-based vector envs can buffer.

Gymnasium's ``spaces.Text`` has no shape (``shape is None``), so Stable-Baselines3's
``DummyVecEnv`` cannot allocate its observation buffer for it (``TypeError: 'NoneType'
object is not iterable``), and with it ``evaluate_policy``, ``EvalCallback`` and
``make_vec_env`` fail on a text environment. :class:`BufferedText` is the same space (same
``contains``, ``sample``, equality and charset rules) that says what one observation is
as an array element: a scalar (``shape == ()``) Python object (``dtype == object``). A
vector env then stores one string per sub-environment in an object array of shape
``[n_envs]``.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces


class BufferedText(spaces.Text):
    """``gymnasium.spaces.Text`` with ``shape == ()`` and ``dtype == object``.

    :param max_length: longest string (characters)
    :param min_length: shortest string
    :param charset: allowed characters
    :param seed: seeds :meth:`sample`
    """

    def __init__(self, max_length: int, *, min_length: int = 1,
                 charset: frozenset[str] | str = spaces.text.alphanumeric,
                 seed: int | np.random.Generator | None = None):
        super().__init__(max_length, min_length=min_length, charset=charset, seed=seed)
        self._shape = ()
        self.dtype = np.dtype(object)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def __repr__(self) -> str:
        return f"Buffered{super().__repr__()}"
