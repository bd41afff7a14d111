"""Files read as data, bounded: a regular file of at most a limit of bytes (:func:`read_bounded`), and plain,
finite JSON of bounded nesting (:func:`parse_json`). Shared by the conformance reader and the Hugging Face
file reader (standard library only)."""

from __future__ import annotations

import json
import math
from typing import Any

MAX_NESTING = 32
"""The deepest a dump line's JSON may nest (a turn's ids nest 4 deep)."""
MAX_ABS_INT = 2 ** 63


def read_bounded(path: str, limit: int, what: str) -> bytes:
    """A regular file's bytes, at most ``limit`` of them: a FIFO, a device (``/dev/zero``) or a folder is refused
    before it is read, and a FIFO is opened without waiting for a writer. Raises ``ValueError`` (one line) or
    ``OSError``.

    :param path: the file
    :param limit: the most bytes read
    :param what: what the file is, for messages (``"the dump"``)
    """
    import os
    import stat

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(f.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ValueError(f"{what} {path} is not a regular file (a folder, a FIFO or a device); give a file")
        if info.st_size > limit:
            raise ValueError(f"{what} {path} is {info.st_size} bytes, more than the {limit} read")
        blob = f.read(limit + 1)
    if len(blob) > limit:
        raise ValueError(f"{what} {path} is more than the {limit} bytes read")
    return blob


def _no_constant(text: str) -> Any:
    raise ValueError(f"holds {text}, not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"holds {text[:20]}, which overflows a float")
    return value


def _bounded_int(text: str) -> int:
    if len(text.lstrip("-")) > 19 or abs(int(text)) >= MAX_ABS_INT:
        raise ValueError(f"holds an integer of {len(text.lstrip('-'))} digits, beyond 64 bits")
    return int(text)


def parse_json(text: str) -> Any:
    """Plain, finite JSON: no ``NaN`` or ``Infinity``, no float that overflows (``1e400``), no integer beyond 64
    bits, nesting at most :data:`MAX_NESTING` deep; anything else is a ``ValueError`` (one line)."""
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_float=_finite_float, parse_int=_bounded_int)
    except RecursionError:
        raise ValueError(f"nests deeper than {MAX_NESTING} levels") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"is not JSON ({err.msg})") from None
    stack = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if depth > MAX_NESTING:
            raise ValueError(f"nests deeper than {MAX_NESTING} levels")
        if isinstance(item, dict):
            stack.extend((v, depth + 1) for v in item.values())
        elif isinstance(item, list):
            stack.extend((v, depth + 1) for v in item)
    return value
