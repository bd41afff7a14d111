"""What ``bugfix-gym serve`` lets in: where it listens, who may call it, how many at once and for how long
(docs/serve.md "Security"). Every setting is one field of :class:`ServeGuard`, and its flag is read off the
field (:func:`add_guard_flags`), so the server's limits have one declaration each.

* **Where**: ``--host`` must be an IP address (or ``localhost``); an empty, ``0`` or ``*`` host, which
  ``socket`` would take as every interface, is refused, and so is any address beyond loopback unless
  ``--allow-remote`` says so, which then prints a warning (:func:`listen_address`).
* **Who**: with an API key (``--api-key`` or :data:`API_KEY_ENV`, as vLLM's ``--api-key`` /
  ``VLLM_API_KEY``) every route but ``/health`` needs ``Authorization: Bearer KEY``, compared in constant
  time (:meth:`ServeGuard.key_matches`). Without one, a request must name the server by an IP address or
  ``localhost`` in its ``Host`` header (:func:`host_header_ok`): a web page that rebinds its own DNS name
  to 127.0.0.1 cannot reach it.
* **How many, how long**: at most ``max_connections`` connections (one thread each); one more is answered
  503 at once. Requests reach the model (one at a time) in the order they arrived, so a client with a
  connection waits behind at most ``max_connections - 1`` others. A request's line, headers and body must
  arrive within ``request_deadline_s`` of its first line, and an idle keep-alive connection is closed after
  ``idle_timeout_s``.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import hmac
import ipaddress
import os
from typing import Any

#: the environment variable holding the API key (the safer place: a command line is visible to every user)
API_KEY_ENV = "BUGFIX_GYM_API_KEY"


def _field(default: Any, help: str, flag: str, kind: type | None = None, metavar: str | None = None) -> Any:
    """A :class:`ServeGuard` field: its default, its help line and its command-line flag."""
    return dataclasses.field(default=default, metadata=dict(help=help, flag=flag, kind=kind, metavar=metavar))


@dataclasses.dataclass(frozen=True)
class ServeGuard:
    """The server's access rules and limits.

    :param api_key: the key every request but ``GET /health`` must send as ``Authorization: Bearer KEY``
        (None: no key)
    :param allow_remote: listen on an address beyond loopback (``--host 0.0.0.0`` or an interface's IP)
    :param max_connections: connections open at once (each holds a thread); one more is answered 503
    :param request_deadline_s: seconds from a request's first line to the end of its body
    :param idle_timeout_s: seconds a keep-alive connection may wait for its next request
    """

    api_key: str | None = _field(None, f"require this key as 'Authorization: Bearer KEY' (default: ${API_KEY_ENV}; "
                                       "prefer the variable: a command line is visible to other users)",
                                 "--api-key", metavar="KEY")
    allow_remote: bool = _field(False, "allow a --host beyond loopback (0.0.0.0: every interface); a warning "
                                       "is printed", "--allow-remote")
    max_connections: int = _field(16, "connections open at once, each with one request at most; more are answered "
                                      "503 (default: 16)", "--max-connections", int, "N")
    request_deadline_s: float = _field(30.0, "seconds a request may take to arrive, headers and body (default: 30)",
                                       "--request-deadline", float, "S")
    idle_timeout_s: float = _field(30.0, "seconds an idle keep-alive connection is kept (default: 30)",
                                   "--idle-timeout", float, "S")

    def __post_init__(self) -> None:
        if self.api_key is not None:
            check_api_key(self.api_key)
        for name, low, high in (("max_connections", 1, 4096),):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
                raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        for name in ("request_deadline_s", "idle_timeout_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.1 <= value <= 3600:
                raise ValueError(f"{name} must be a number of seconds from 0.1 to 3600, got {value!r}")

    def key_matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header carries the key (always, without a key), in time that does not
        depend on where the two differ: both sides are hashed first, so even the length is not compared.

        :param authorization: the header's value, or None
        """
        if self.api_key is None:
            return True
        scheme, _, token = (authorization or "").strip().partition(" ")
        given = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        wanted = hashlib.sha256(self.api_key.encode("utf-8")).digest()
        return hmac.compare_digest(given, wanted) and scheme.lower() == "bearer"


def check_api_key(key: str) -> None:
    """A one-line ``ValueError`` for a key no client could send: empty, or with spaces or control characters."""
    if not key:
        raise ValueError(f"the API key is empty; give one (--api-key or ${API_KEY_ENV}) or unset {API_KEY_ENV}")
    if not key.isprintable() or any(c.isspace() for c in key) or len(key) > 4096:
        raise ValueError("the API key must be printable text without spaces, at most 4096 characters")


def add_guard_flags(parser: argparse.ArgumentParser) -> None:
    """``serve``'s flags for :class:`ServeGuard`, one per field (its ``flag``, ``help`` and type).

    :param parser: the ``serve`` sub-command's parser
    """
    from agents.cli.flags import Number

    for field in dataclasses.fields(ServeGuard):
        meta = field.metadata
        if field.type in (bool, "bool"):
            parser.add_argument(meta["flag"], dest=field.name, action="store_true", help=meta["help"])
            continue
        kind = meta["kind"]
        low = 1 if kind is int else 0.1
        parse: Any = str if kind is None else Number(kind, low, 4096 if kind is int else 3600,
                                                     what=f"{'a whole number' if kind is int else 'a number'} from "
                                                          f"{low}")
        parser.add_argument(meta["flag"], dest=field.name, type=parse, default=None, metavar=meta["metavar"],
                            help=meta["help"])


def guard_from_args(args: argparse.Namespace, environ: Any = None) -> ServeGuard:
    """The :class:`ServeGuard` of ``serve``'s parsed flags (a flag left out keeps the field's default; the API key
    falls back on :data:`API_KEY_ENV`); a bad value is a one-line ``ValueError``.

    :param args: the parsed command line
    :param environ: the environment (default: ``os.environ``)
    """
    environ = os.environ if environ is None else environ
    values = {f.name: getattr(args, f.name) for f in dataclasses.fields(ServeGuard)
              if getattr(args, f.name, None) is not None}
    if values.get("api_key") is None and API_KEY_ENV in environ:
        values["api_key"] = environ[API_KEY_ENV]
    return ServeGuard(**values)


def listen_address(host: str, allow_remote: bool) -> tuple[str, bool]:
    """``--host`` as the address to bind, and whether it is beyond loopback; a one-line ``ValueError`` for a host
    that is not an IP address (an empty or ``0`` host would be every interface, a name may resolve to any), or
    for an address beyond loopback without ``allow_remote``.

    :param host: the ``--host`` text
    :param allow_remote: ``--allow-remote`` was given
    """
    if host.lower() == "localhost":
        return "127.0.0.1", False
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        shape = "would listen on every interface" if host.strip() in ("", "0", "*", "0.0", "::") else \
            "is not an IP address"
        raise ValueError(f"--host {host!r} {shape}: give 127.0.0.1 (this machine only, the default) or, with "
                         "--allow-remote, the IP address to listen on (0.0.0.0: every interface)") from None
    if address.is_loopback:
        return str(address), False
    if not allow_remote:
        where = "every interface" if address.is_unspecified else "beyond this machine"
        raise ValueError(f"--host {host} listens on {where}; add --allow-remote to do that (and set an API key: "
                         f"${API_KEY_ENV} or --api-key)")
    return str(address), True


def remote_warning(address: str, guard: ServeGuard) -> str:
    """The warning ``serve`` prints when it listens beyond loopback."""
    where = "every interface" if ipaddress.ip_address(address).is_unspecified else address
    key = "every request but /health needs the API key" if guard.api_key is not None else \
        f"with no API key, anyone who can reach it can use it (set ${API_KEY_ENV})"
    return f"warning: bugfix-gym serve listens on {where}, beyond this machine: {key}; there is no TLS"


def host_header_ok(value: str | None, guard: ServeGuard) -> bool:
    """Whether a request's ``Host`` header may be answered: any, with an API key; else an IP address or
    ``localhost`` (with a port or not), so that a page on a DNS name rebound to this machine is refused.

    :param value: the ``Host`` header (None: missing)
    :param guard: the server's rules
    """
    if guard.api_key is not None:
        return True
    if not value:
        return False
    host = value.strip()
    if host.startswith("["):  # [::1]:8000
        host = host[1:host.find("]")] if "]" in host else ""
    elif host.count(":") == 1:
        host = host.rsplit(":", 1)[0]
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True
