"""``bugfix-gym serve MODEL``: an OpenAI-compatible chat server (standard library ``http.server``) that
plays a saved TinyAgent, or a Hugging Face ``save_pretrained`` folder (a TRL output), so any OpenAI-client
harness can play BugFix with it (docs/serve.md).

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/NAME``), ``POST /v1/chat/completions``
(non-streaming), ``POST /tokenize``. A model file's agent reads each request's chat as a BugFix transcript
(:func:`bugfix_gym.integrations.chat.transcript_of`) and answers with ONE call
(:class:`agents.bugfix.chat_agent.ChatAgent`): a ``tool_calls`` entry when the request has ``tools``,
else the call's text. A folder's LM answers through its own chat template (:mod:`agents.cli.serve_hf`).
Responses can carry the token ids (``return_token_ids``) and each token's ``top_logprobs``. Errors are
OpenAI-shaped JSON, ``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import http.client
import json
import re
import reprlib
import socket
import sys
import threading
import time
import uuid
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

from bugfix_gym.contract.text import printable
from bugfix_gym.integrations.chat import ChatError, tool_call_of, transcript_of
from bugfix_gym.integrations.chat_template import ChatTemplateError

from agents.cli.evaluate import load_model, override_decoding
from agents.cli.flags import UNSET
from agents.cli.serve_guard import ServeGuard, guard_from_args, host_header_ok, listen_address, remote_warning

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
    from agents.bugfix.chat_agent import ChatAgent, WrittenCall
    from agents.cli.serve_hf import HFAnswer, HFChatModel

MAX_BODY_BYTES = 1 << 20  # a request body above this is refused (413): BugFix chats are a few KB
LINGER_S, LINGER_BYTES = 2.0, 2 * MAX_BODY_BYTES  # what is read and dropped after refusing an unread body
MAX_HEAD_BYTES = 64 << 10  # a request's header lines together (431 above): http.server alone allows 100 x 64 KiB
MAX_CHOICES = 16  # the most calls ``n`` may ask for in one request
MIN_TEMPERATURE = 1e-3  # a temperature in (0, MIN_TEMPERATURE) samples at MIN_TEMPERATURE (float32 would divide by 0)
#: the OpenAI error ``type`` of each status (the rest are ``invalid_request_error``)
ERROR_TYPES = {401: "invalid_request_error", 404: "not_found_error", 500: "server_error", 503: "server_error"}
#: http.server's own errors (a bad request line, huge headers, an unknown method) as codes and one-line messages
HTTP_ERRORS = {
    400: ("bad_request", "the request line or headers cannot be read as HTTP/1.1"),
    408: ("request_timeout", "the request did not arrive in time"),
    414: ("request_line_too_long", "the request line is longer than 64 KiB"),
    431: ("headers_too_large", f"the request's headers are larger than {MAX_HEAD_BYTES >> 10} KiB (or over 100 lines)"),
    501: ("unsupported_method", "this server answers GET and POST only"),
    505: ("unsupported_http_version", "this server speaks HTTP/1.0 and HTTP/1.1"),
}
_ROUTES = "routes: GET /health, GET /v1/models, POST /v1/chat/completions, POST /tokenize"
MAX_TOP_LOGPROBS = 20  # OpenAI's limit on top_logprobs


class ApiError(Exception):
    """An error answered as OpenAI's error JSON.

    :param status: the HTTP status (400, 401, 404, 405, 408, 411, 413, 415)
    :param message: one line: what was wrong and what to send instead
    :param code: OpenAI's machine-readable code (``invalid_value``, ``model_not_found``, ...)
    :param param: the request field at fault, if any
    """

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's JSON body."""
        return error_body(self.status, self.message, self.code, self.param)


def error_body(status: int, message: str, code: str, param: str | None = None) -> dict[str, Any]:
    """OpenAI's error JSON: ``{"error": {"message", "type", "code", "param"}}``, the message one printable line."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "server_error")
    return {"error": {"message": printable(message, 500), "type": kind, "code": code, "param": param}}


def _response(status: int, body: dict[str, Any], extra: str = "") -> bytes:
    """A whole HTTP/1.1 response that closes the connection (what the accept loop sends when it is full)."""
    data = json.dumps(body).encode("utf-8")
    head = (f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{extra}Connection: close\r\n\r\n")
    return head.encode("ascii") + data


class ChatServer(ThreadingHTTPServer):
    """The HTTP server: one :class:`ChatAgent` answers every request (one call at a time), within the limits
    of its :class:`~agents.cli.serve_guard.ServeGuard` (docs/serve.md "Security").

    Each connection has a thread, at most ``guard.max_connections`` of them: the accept loop answers one
    more with 503 itself. A watchdog thread closes the reading side of a connection whose request has not
    arrived within ``guard.request_deadline_s`` (or that idled past ``guard.idle_timeout_s``), so a slow
    client holds its thread for a bounded time. Requests take the model in the order they arrived
    (:class:`Turns`), so one behind a flood waits for at most ``max_connections - 1`` others.

    :param address: ``(host, port)``: an IP address (:func:`~agents.cli.serve_guard.listen_address`: beyond
        loopback only with ``guard.allow_remote``); port 0 picks a free one (read it from ``server_address``)
    :param agent: the agent
    :param model_name: the name ``/v1/models`` lists and requests' ``model`` must give
    :param call_mask_key: None, or the env call mask (``call_mask`` / ``useful_calls``) each request
        must send under that key, as 9 booleans over ``bugfix_gym.CALLS``
    :param log_requests: log each request (and each dropped connection) to stderr, one line each
    :param guard: the access rules and limits (default: ``ServeGuard()``, loopback, no key)
    :raises ValueError: a host that is not an address it may listen on (one line)
    """

    daemon_threads = True
    # http.server's listen backlog is 5: a harness with many rollouts in flight (verifiers runs one per
    # group member) got connection resets past it. Requests still run one at a time on the model.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], agent: ChatAgent | HFChatModel, model_name: str,
                 call_mask_key: str | None = None, log_requests: bool = True, guard: ServeGuard | None = None):
        self.guard = guard or ServeGuard()
        host, self.remote = listen_address(address[0], self.guard.allow_remote)
        self.address_family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.agent, self.model_name, self.call_mask_key = agent, model_name, call_mask_key
        self.log_requests, self.started = log_requests, int(time.time())
        self.refused = 0  # connections answered 503 by the accept loop
        self._lock = threading.Lock()
        self._open = 0
        self._connections: set[socket.socket] = set()
        self._connection_threads: list[threading.Thread] = []  # joined by server_close
        self.turns = Turns()
        self._deadlines: dict[int, tuple[float, ChatHandler]] = {}
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="bugfix-gym-serve-deadlines", daemon=True)
        super().__init__((host, address[1]), ChatHandler)  # a failed bind calls server_close first
        self._watchdog.start()

    @property
    def url(self) -> str:
        """The base URL clients use (``http://host:port/v1``)."""
        host, port = self.server_address[:2]
        host = host if isinstance(host, str) else host.decode()
        return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"

    # ------------------------------------------------------------------ connections
    def process_request(self, request: Any, client_address: Any) -> None:
        """A thread for the connection, or (over ``max_connections``) a 503 written from here."""
        with self._lock:
            full = self._open >= self.guard.max_connections
            if not full:
                self._open += 1
                self._connections.add(request)
        if full:
            self._refuse(request)
            return
        thread = threading.Thread(target=self.process_request_thread, args=(request, client_address), daemon=True)
        with self._lock:
            self._connection_threads = [t for t in self._connection_threads if t.is_alive()]
            self._connection_threads.append(thread)
        try:
            thread.start()
        except BaseException:
            self._done(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._done(request)

    def _done(self, request: socket.socket) -> None:
        with self._lock:
            self._open -= 1
            self._connections.discard(request)

    def _refuse(self, sock: socket.socket) -> None:
        """Answer 503 without a thread and close: nothing here waits on the client."""
        self.refused += 1
        busy = error_body(503, f"the server has {self.guard.max_connections} connections open, its limit; retry "
                               "in a moment", "server_busy")
        try:
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.recv(MAX_HEAD_BYTES)  # what already arrived: closing over unread bytes would reset the answer
            sock.send(_response(503, busy, "Retry-After: 1\r\n"))
        except OSError:
            pass
        self.shutdown_request(sock)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A connection that failed outside a request (a reset, a client that stopped reading): one line, no
        traceback."""
        error = sys.exc_info()[1]
        if self.log_requests:
            print(f"bugfix-gym serve: connection from {client_address[0]} dropped ({type(error).__name__})",
                  file=sys.stderr)

    # ------------------------------------------------------------------ deadlines and the model queue
    def watch(self, handler: ChatHandler, seconds: float | None) -> None:
        """Close ``handler``'s reading side ``seconds`` from now (None: stop watching it)."""
        with self._lock:
            if seconds is None:
                self._deadlines.pop(id(handler), None)
            else:
                self._deadlines[id(handler)] = (time.monotonic() + seconds, handler)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            now = time.monotonic()
            with self._lock:
                late = [h for key, (t, h) in list(self._deadlines.items()) if t <= now and self._deadlines.pop(key)]
            for handler in late:
                handler.expire()

    def server_close(self, drain_s: float = 5.0) -> None:
        """Stop listening, close the open connections and join their threads (at most ``drain_s`` in all): a
        connection thread that frees the last reference to the server, and with it the model's tensors, while
        the interpreter exits aborts the process (``terminate called without an active exception``)."""
        self._stop.set()
        super().server_close()
        with self._lock:
            for sock in self._connections:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
            threads, self._connection_threads = self._connection_threads, []
        end = time.monotonic() + drain_s
        for thread in [self._watchdog, *threads]:
            if thread.is_alive():
                thread.join(max(0.0, end - time.monotonic()))


class Turns:
    """First come, first served: one request at a time on the model, in the order they asked (a ``Lock``
    wakes its waiters in no particular order, so a client behind a flood could wait for ever)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: collections.deque[threading.Event] = collections.deque()
        self._busy = False

    @property
    def waiting(self) -> int:
        """Requests waiting for their turn."""
        return len(self._queue)

    @contextlib.contextmanager
    def turn(self) -> Iterator[None]:
        """Wait for this request's turn, and hold it for the ``with`` block."""
        mine = threading.Event()
        with self._lock:
            if self._busy:
                self._queue.append(mine)
            else:
                self._busy = True
                mine.set()
        mine.wait()
        try:
            yield
        finally:
            with self._lock:
                if self._queue:
                    self._queue.popleft().set()
                else:
                    self._busy = False


@contextlib.contextmanager
def serving(model: str | Path | TokenOnPolicyAlgorithm, model_name: str = "bugfix-agent", host: str = "127.0.0.1",
            port: int = 0, **kwargs: Any) -> Iterator[ChatServer]:
    """A :class:`ChatServer` answering in a background thread for the ``with`` block, then shut down:
    ``with serving("tokenppo.zip") as server: client(base_url=server.url)``.

    :param model: a model file, a ``save_pretrained`` folder (:mod:`agents.cli.serve_hf`), or a loaded algorithm
        (its policy's decoding as it is)
    :param model_name: the served name
    :param host: the address (default: local only)
    :param port: the port (0: a free one)
    :param kwargs: more :class:`ChatServer` arguments (``call_mask_key``, ``log_requests``, ``guard``)
    """
    from agents.algorithms.presets import load_algorithm
    from agents.bugfix import aux_losses  # noqa: F401 (registers the upgrade of older files' settings)
    from agents.bugfix.chat_agent import ChatAgent
    from agents.cli.serve_hf import load_served

    agent: ChatAgent | HFChatModel
    if isinstance(model, (str, Path)) and Path(model).is_dir():
        agent = load_served(Path(model))
    else:
        agent = ChatAgent(load_algorithm(model) if isinstance(model, (str, Path)) else model)
    server = ChatServer((host, port), agent, model_name, **kwargs)
    thread = threading.Thread(target=server.serve_forever, name="bugfix-gym-serve", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class _HeadReader:
    """The connection's reader, with one budget of :data:`MAX_HEAD_BYTES` for a request's header lines
    (http.server's own limits, 100 lines of 64 KiB each, let one connection hold 6.4 MB)."""

    def __init__(self, raw: Any):
        self.raw = raw
        self.left: int | None = None  # None: not reading headers

    def readline(self, size: int | None = -1) -> bytes:
        if self.left is None:
            return self.raw.readline(size)
        want = self.left + 1 if size is None or size < 0 else min(size, self.left + 1)
        line = self.raw.readline(want)
        self.left -= len(line)
        if self.left < 0:
            raise http.client.LineTooLong("header lines")
        return line

    def __getattr__(self, name: str) -> Any:
        return getattr(self.raw, name)


class ChatHandler(BaseHTTPRequestHandler):
    """The routes. Every answer, an error or not, whatever the method, is JSON; no exception text reaches
    the client, and a failure in a native library (a ``BaseException``) is a 500 like any other."""

    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
    server: ChatServer

    def setup(self) -> None:
        self.timeout = self.server.guard.idle_timeout_s  # type: ignore[misc]  # each socket read or write
        super().setup()
        self.rfile = _HeadReader(self.rfile)  # type: ignore[assignment]
        self.expired = False
        self.body_read = False

    def finish(self) -> None:
        self.server.watch(self, None)
        with contextlib.suppress(OSError):
            super().finish()
        if self.close_connection and not self.body_read and not self.expired and self._declares_body():
            self._linger()

    def _declares_body(self) -> bool:
        headers = getattr(self, "headers", None)  # None: the request line or headers could not be read
        return headers is None or headers.get("Content-Length", "0").strip() not in ("", "0") \
            or headers.get("Transfer-Encoding") is not None

    def _linger(self) -> None:
        """After answering a request whose body was not read (a 413, a 401, refused framing), stop writing and read
        and drop what the client still sends, for at most :data:`LINGER_S` and :data:`LINGER_BYTES`: closing
        over unread bytes resets the connection, and a client still sending its body then loses the answer. Not after a
        deadline: a client that slow is not waited for."""
        sock, left, end = self.connection, LINGER_BYTES, time.monotonic() + LINGER_S
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)
            while left > 0 and (wait := end - time.monotonic()) > 0:
                sock.settimeout(wait)
                chunk = sock.recv(min(1 << 16, left))
                if not chunk:
                    break
                left -= len(chunk)

    def expire(self) -> None:
        """Called by the watchdog: the request is late; its reads end (the answer can still be written)."""
        self.expired = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RD)

    def handle_one_request(self) -> None:
        self.server.watch(self, self.server.guard.idle_timeout_s)  # the next request line must start by then
        super().handle_one_request()

    def parse_request(self) -> bool:
        self.body_read = False
        self.server.watch(self, self.server.guard.request_deadline_s)  # the headers and the body
        self.rfile.left = MAX_HEAD_BYTES  # type: ignore[attr-defined]
        try:
            return super().parse_request()
        finally:
            self.rfile.left = None  # type: ignore[attr-defined]

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """http.server's own errors (request line, headers, method) as OpenAI JSON; the connection is closed."""
        self.close_connection = True
        if self.request_version not in ("HTTP/1.0", "HTTP/1.1"):  # a request line it could not read: answer 1.1
            self.request_version = "HTTP/1.1"
        name, text = HTTP_ERRORS.get(code, ("bad_request", HTTP_ERRORS[400][1]))
        if code == 400 and message:
            text = f"{text} ({message})"
        self._write(code, error_body(code, text, name))

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self._post)

    def _not_allowed(self) -> None:
        self.close_connection = True  # a body it may have is not read
        self._answer(lambda: _raise(ApiError(405, f"method {self.command} is not allowed; {_ROUTES}",
                                             "method_not_allowed")))

    do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_HEAD = do_TRACE = do_CONNECT = _not_allowed  # noqa: N815

    def _get(self) -> dict[str, Any]:
        self._no_body()
        path, name = self.path.split("?")[0].rstrip("/"), self.server.model_name
        if path == "/health":
            return {"status": "ok", "model": name}
        self._authorised()
        if path in ("/v1/models", f"/v1/models/{name}"):
            card = {"id": name, "object": "model", "created": self.server.started, "owned_by": "bugfix-gym"}
            return card if path.endswith(f"/{name}") else {"object": "list", "data": [card]}
        if path.startswith("/v1/models/"):
            raise ApiError(404, f"no model {path[len('/v1/models/'):][:80]!r}; this server serves {name!r}",
                           "model_not_found")
        raise ApiError(404, f"no route GET {path[:80]}; {_ROUTES}", "unknown_route")

    def _post(self) -> dict[str, Any]:
        path = self.path.split("?")[0].rstrip("/")
        self._authorised()
        if path not in ("/v1/chat/completions", "/tokenize"):
            self.close_connection = True  # the body is not read
            raise ApiError(404, f"no route POST {path[:80]}; chats go to POST /v1/chat/completions",
                           "unknown_route")
        kind = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if kind != "application/json":
            self.close_connection = True
            raise ApiError(415, f"the request's Content-Type is {kind[:60]!r}; send the chat as application/json",
                           "unsupported_media_type")
        body = parse_body(self._body())
        with self.server.turns.turn():
            return tokenize(self.server, body) if path == "/tokenize" else chat_completion(self.server, body)

    def _authorised(self) -> None:
        """A 401 unless the request carries the API key (every route but ``/health``)."""
        if not self.server.guard.key_matches(self.headers.get("Authorization")):
            self.close_connection = True
            raise ApiError(401, "this server needs its API key: send the header 'Authorization: Bearer KEY'",
                           "invalid_api_key")

    def _no_body(self) -> None:
        """A GET's body is not read: close the connection after it rather than read it as the next request."""
        if self.headers.get("Content-Length") not in (None, "0") or self.headers.get("Transfer-Encoding"):
            self.close_connection = True
        self.server.watch(self, None)

    def _body(self) -> bytes:
        """The request's body: one ``Content-Length`` of ASCII digits, at most :data:`MAX_BODY_BYTES`, no
        ``Transfer-Encoding`` (a body framed two ways is refused: a proxy could read it the other way)."""
        lengths = self.headers.get_all("Content-Length") or []
        if self.headers.get("Transfer-Encoding") is not None:
            self.close_connection = True
            if lengths:
                raise ApiError(400, "the request has both Content-Length and Transfer-Encoding; send Content-Length "
                                    "only", "ambiguous_framing")
            raise ApiError(411, "the request needs a Content-Length header (chunked bodies are not read)",
                           "missing_content_length")
        if len(lengths) != 1 or not re.fullmatch(r"[0-9]{1,10}", lengths[0].strip()):
            self.close_connection = True
            if not lengths:
                raise ApiError(411, "the request needs a Content-Length header (chunked bodies are not read)",
                               "missing_content_length")
            raise ApiError(400, "the request needs one Content-Length header of ASCII digits",
                           "invalid_content_length")
        length = int(lengths[0])
        if length > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, f"the request body is {length} bytes, more than the {MAX_BODY_BYTES} this "
                                "server reads: send a shorter chat", "request_too_large")
        raw = self.rfile.read(length)
        self.body_read = True
        self.server.watch(self, None)
        if len(raw) < length:
            self.close_connection = True
            if self.expired:
                raise ApiError(408, f"the request body did not arrive within {self.server.guard.request_deadline_s:g} "
                                    "s of its first line", "request_timeout")
            raise ApiError(400, f"the body ended after {len(raw)} of its {length} bytes", "incomplete_body")
        return raw

    def _answer(self, route: Callable[[], dict[str, Any]]) -> None:
        status, body = 200, None
        try:
            if self.expired:
                self.close_connection = True
                raise ApiError(408, f"the request's headers did not arrive within "
                                    f"{self.server.guard.request_deadline_s:g} s", "request_timeout")
            if not host_header_ok(self.headers.get("Host"), self.server.guard):
                self.close_connection = True
                raise ApiError(400, f"the Host header {self.headers.get('Host', '')[:80]!r} is not an IP address or "
                                    "localhost; without an API key this server answers only those (a web page "
                                    "could reach it through a DNS name)", "invalid_host")
            body = route()
        except ApiError as e:
            status, body = e.status, e.body()
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001 - a bug or a native panic: 500 JSON, no exception text; keep serving
            self.log_message("internal error: %s", type(e).__name__)
            status, body = 500, error_body(500, "internal error; the server logged its type", "internal_error")
        self._write(status, body)

    def _write(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if status == 503:
            self.send_header("Retry-After", "1")
        if status == 401:
            self.send_header("WWW-Authenticate", "Bearer")
        if status == 405:
            self.send_header("Allow", "GET, POST")
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        if self.server.log_requests:
            super().log_message(format, *(printable(str(a), 200) for a in args))


def _raise(error: Exception) -> Any:
    raise error


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not a JSON number")


def parse_body(raw: bytes) -> Any:
    """A request body as JSON, or a 400 ``invalid_json`` (not UTF-8, not JSON, NaN / Infinity, an integer of
    more than 4300 digits, nesting deeper than the parser's stack)."""
    try:
        return json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError:
        raise ApiError(400, "the request body is not UTF-8 text; send a JSON object", "invalid_json") from None
    except json.JSONDecodeError as e:
        raise ApiError(400, f"the request body is not JSON ({e.msg} at character {e.pos}); send a JSON object",
                       "invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body nests too deeply; send a flat chat", "invalid_json") from None
    except ValueError as e:  # NaN, Infinity, an integer of over 4300 digits
        raise ApiError(400, f"the request body is not plain JSON ({printable(str(e), 120)})", "invalid_json") from None


def _encode(server: ChatServer, messages: Any) -> list[int]:
    """The chat's ids as the served model reads them, or a 400 that says what is wrong with it."""
    from agents.bugfix.chat_agent import ContextFull
    from agents.cli.serve_hf import HFChatModel

    try:
        if isinstance(server.agent, HFChatModel):
            return server.agent.encode(messages)
        return server.agent.encode(transcript_of(messages))
    except ChatError as e:
        raise ApiError(400, str(e), "invalid_messages", "messages") from None
    except ContextFull as e:
        raise ApiError(400, str(e), "context_length_exceeded", "messages") from None
    except ChatTemplateError as e:  # an HF tokenizer's template over its budget (or failing) on this chat
        message = str(e) if e.over_budget else "the model's chat template or tokenizer cannot encode this chat"
        raise ApiError(400, message, "chat_template_error", "messages") from None


def tokenize(server: ChatServer, body: Any) -> dict[str, Any]:
    """``POST /tokenize`` (vLLM's): a chat's ids as the model reads them, without sampling.

    :param server: the server
    :param body: ``{"model", "messages"}``
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object with \"model\" and \"messages\"", "invalid_json")
    _model_of(body, server.model_name)
    ids = _encode(server, body.get("messages"))
    return {"count": len(ids), "max_model_len": server.agent.max_len, "tokens": ids}


def chat_completion(server: ChatServer, body: Any) -> dict[str, Any]:
    """A chat completions request -> its response: the chat read as a transcript (a folder's LM: rendered by its
    chat template), ``n`` calls sampled.

    :param server: the server (its agent, model name and call-mask setting)
    :param body: the request's parsed JSON
    """
    from agents.cli.serve_hf import HFChatModel

    request = read_request(body, server.model_name, server.call_mask_key)
    ids = _encode(server, request["messages"])
    top = request["top_logprobs"]
    if isinstance(server.agent, HFChatModel):
        answers = server.agent.write(ids, n=request["n"], temperature=request["temperature"], seed=request["seed"],
                                     max_tokens=request["max_tokens"], top=top)
        choices = [hf_choice(i, a, server.agent, request, ids) for i, a in enumerate(answers)]
        written = sum(len(a.tokens) for a in answers)
    else:
        if top and server.agent.policy.foresight is not None:
            raise ApiError(400, "top_logprobs is not available with --foresight (it closes ops after the model "
                                "scores them); leave it out", "unsupported_value", "top_logprobs")
        calls = server.agent.write(ids, n=request["n"], temperature=request["temperature"], seed=request["seed"],
                                   max_tokens=request["max_tokens"], open_calls=request["open_calls"])
        tops = [top_logprobs(server.agent, ids, call.tokens, top, request["temperature"], request["open_calls"])
                if top else None for call in calls]
        choices = [choice(i, call, request["tools"], request["logprobs"], tops[i], request)
                   for i, call in enumerate(calls)]
        written = sum(len(call.tokens) for call in calls)
    response = {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
                "model": server.model_name, "choices": choices,
                "usage": {"prompt_tokens": len(ids), "completion_tokens": written, "total_tokens": len(ids) + written}}
    if request["return_token_ids"]:
        response["prompt_token_ids"] = ids
    return response


def _logprob_entry(token: int, text: str, logp: float, as_ids: bool) -> dict[str, Any]:
    word = f"token_id:{token}" if as_ids else text
    return {"token": word, "logprob": logp, "bytes": list(word.encode("utf-8"))}


def _logprobs(tokens: list[int], logps: list[float], text_of: Callable[[int], str],
              tops: list[list[tuple[int, float]]] | None, as_ids: bool) -> dict[str, Any]:
    """A choice's ``logprobs``: each token with its log-prob and its ``top_logprobs`` (most likely first)."""
    content = []
    for k, (token, lp) in enumerate(zip(tokens, logps)):
        entry = _logprob_entry(token, text_of(token), lp, as_ids)
        entry["top_logprobs"] = [_logprob_entry(t, text_of(t), v, as_ids) for t, v in (tops[k] if tops else [])]
        content.append(entry)
    return {"content": content}


def choice(index: int, call: WrittenCall, tools: bool, logprobs: bool,
           tops: list[list[tuple[int, float]]] | None = None, request: dict[str, Any] | None = None
           ) -> dict[str, Any]:
    """One ``choices`` entry: the call as a tool call (with ``tools``, when it is one of the env's calls),
    else as text; ``finish_reason`` ``tool_calls``, ``stop`` (ended with ``<eoc>``) or ``length``.

    :param index: the choice's index
    :param call: the sampled call
    :param tools: the request offered tools (and did not say ``tool_choice: "none"``)
    :param logprobs: add each token's log-prob (under the distribution it was sampled from)
    :param tops: per token, the most likely ids and their log-probs (``top_logprobs``)
    :param request: the read request (``return_token_ids``, ``return_tokens_as_token_ids``)
    """
    request = request or {}
    function = tool_call_of(call.text) if tools and call.ended else None
    message: dict[str, Any] = {"role": "assistant", "content": None if function else call.text}
    if function is not None:
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}]
    finish = "tool_calls" if function is not None else "stop" if call.ended else "length"
    words = dict(zip(call.tokens, call.words))
    out = {"index": index, "message": message, "finish_reason": finish,
           "logprobs": _logprobs(call.tokens, call.logp, lambda t: words.get(t, str(t)), tops,
                                 bool(request.get("return_tokens_as_token_ids"))) if logprobs else None}
    if request.get("return_token_ids"):
        out["token_ids"] = list(call.tokens)
    return out


def hf_choice(index: int, answer: HFAnswer, model: HFChatModel, request: dict[str, Any], prompt: list[int]
              ) -> dict[str, Any]:
    """One ``choices`` entry of a folder's LM: its tool calls (read with the response template) when the request
    offered tools, else its text.

    :param index: the choice's index
    :param answer: the sampled answer
    :param model: the served model
    :param request: the read request
    :param prompt: the chat's ids the answer continues
    """
    calls = model.tool_calls(answer, prompt) if request["tools"] else []
    message: dict[str, Any] = {"role": "assistant", "content": None if calls else answer.text}
    if calls:
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": c}
                                 for c in calls]
    finish = "tool_calls" if calls else "stop" if answer.ended else "length"
    out = {"index": index, "message": message, "finish_reason": finish,
           "logprobs": _logprobs(answer.tokens, answer.logp, model.token_text, answer.top,
                                 request["return_tokens_as_token_ids"]) if request["logprobs"] else None}
    if request["return_token_ids"]:
        out["token_ids"] = list(answer.tokens)
    return out


def top_logprobs(agent: ChatAgent, ids: list[int], tokens: list[int], k: int, temperature: float,
                 open_calls: list[bool] | None) -> list[list[tuple[int, float]]]:
    """Per written token, the ``k`` most likely ids and their log-probs under the distribution it was sampled
    from (the model at ``temperature``, 1 when greedy, masked by the call grammar from its start state), from
    one full forward over the chat and the call; a token the grammar forces has log-prob 0 and no other.

    :param agent: the served agent
    :param ids: the chat's ids
    :param tokens: the call's ids
    :param k: how many
    :param temperature: the request's temperature
    :param open_calls: the env's call mask (``--call-mask``), or None
    """
    import torch

    from agents.model.threads import use_threads

    policy, grammar = agent.policy, agent.policy.grammar
    state = 0 if grammar is None else (grammar.start if open_calls is None else grammar.start_for(open_calls))
    model = policy.model
    with agent._lock, use_threads(policy.torch_threads, policy.device), torch.no_grad():
        was_training = model.training
        model.eval()
        try:
            device = next(model.parameters()).device
            logits, _ = model(torch.tensor([list(ids) + list(tokens[:-1])], device=device))  # [1, T, V]
        finally:
            model.train(was_training)
    out = []
    for j, token in enumerate(tokens):
        step = logits[0, len(ids) - 1 + j].float() / (temperature or 1.0)  # [V]
        if grammar is not None:
            if grammar.forced(state) is not None:
                out.append([(int(token), 0.0)])
                state = grammar.step(state, token)
                continue
            step = grammar.mask_logits(step[None], torch.tensor([state], device=step.device))[0]
            state = grammar.step(state, token)
        values, index = torch.log_softmax(step, -1).topk(min(k, step.numel()))
        out.append([(int(i), float(v)) for i, v in zip(index.tolist(), values.tolist()) if v > float("-inf")])
    return out


def read_request(body: Any, model_name: str, call_mask_key: str | None) -> dict[str, Any]:
    """A chat completions body -> the settings the agent needs, or an :class:`ApiError` (400 / 404).
    Fields not listed in docs/serve.md (``frequency_penalty``, ``user``, ...) are ignored.

    :param body: the parsed JSON
    :param model_name: the served model's name (``model`` must give it)
    :param call_mask_key: the call mask each request must carry (None: none)
    """
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object with \"model\" and \"messages\"", "invalid_json")
    if body.get("stream"):
        raise ApiError(400, "streaming is not supported: send \"stream\": false (or leave it out)",
                       "unsupported_value", "stream")
    _model_of(body, model_name)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list (bugfix_gym.integrations.chat.tool_schemas())", "invalid_type",
                       "tools")
    return dict(messages=body.get("messages"),
                n=_number(body, "n", int, 1, MAX_CHOICES, 1),
                temperature=_temperature(_number(body, "temperature", float, 0.0, 2.0, 1.0)),
                seed=_number(body, "seed", int, -(2**63), 2**63 - 1, None),
                max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", int, 1, None, None),
                logprobs=_flag(body, "logprobs") or bool(body.get("top_logprobs")),
                top_logprobs=_number(body, "top_logprobs", int, 0, MAX_TOP_LOGPROBS, 0),
                return_token_ids=_flag(body, "return_token_ids"),
                return_tokens_as_token_ids=_flag(body, "return_tokens_as_token_ids"),
                tools=bool(tools) and body.get("tool_choice") != "none",
                open_calls=_open_calls(body, call_mask_key))


def _model_of(body: dict[str, Any], model_name: str) -> None:
    """A 400 without ``model``, a 404 for another model's name."""
    if not isinstance(body.get("model"), str):
        raise ApiError(400, f"the request needs \"model\": {model_name!r}", "missing_model", "model")
    if body["model"] != model_name:
        raise ApiError(404, f"no model {_shown(body['model'])}; this server serves {model_name!r}", "model_not_found",
                       "model")


def _number(body: dict[str, Any], key: str, kind: type, low: float, high: float | None, default: Any) -> Any:
    """``body[key]`` as a ``kind`` in ``[low, high]`` (null or absent: ``default``), else a 400."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if kind is int:
        ok = ok and (isinstance(value, int) or float(value).is_integer())  # float(10**400) would overflow
    if not ok or value < low or (high is not None and value > high):
        bound = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise ApiError(400, f"{key} must be {'an integer' if kind is int else 'a number'} {bound}, got "
                            f"{_shown(value)}", "invalid_value", key)
    return kind(value)


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = _SHORT.maxlong = 40
_SHORT.maxlevel = 2


def _shown(value: Any) -> str:
    """A client's value, short and printable, whatever its size or depth (for error messages)."""
    return printable(_SHORT.repr(value), 60)


def _temperature(value: float) -> float:
    """0 stays greedy; a temperature in (0, :data:`MIN_TEMPERATURE`) samples at :data:`MIN_TEMPERATURE` (as
    float32, 1e-300 is 0 and the logits would be divided by it)."""
    return value if value == 0 or value >= MIN_TEMPERATURE else MIN_TEMPERATURE


def _flag(body: dict[str, Any], key: str) -> bool:
    """``body[key]`` as a boolean (null or absent: False), else a 400."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false, got {_shown(value)}", "invalid_type", key)
    return bool(value)


def _open_calls(body: dict[str, Any], call_mask_key: str | None) -> list[bool] | None:
    """With ``--call-mask KEY``: the env's ``info[KEY]`` the request carries under ``KEY`` (9 booleans)."""
    from bugfix_gym.core.tools import CALLS

    if call_mask_key is None:
        return None
    mask = body.get(call_mask_key)
    if not (isinstance(mask, list) and len(mask) == len(CALLS) and all(isinstance(x, bool) for x in mask)):
        raise ApiError(400, f"this server decodes under the env's call mask: send the env's info[{call_mask_key!r}] "
                            f"as \"{call_mask_key}\": {len(CALLS)} booleans over {', '.join(CALLS)}",
                       "missing_call_mask", call_mask_key)
    return list(mask)


def cmd_serve(args: argparse.Namespace) -> int:
    """Load ``args.model`` (a model file, or a ``save_pretrained`` folder) and serve it until Ctrl-C or SIGTERM;
    returns the exit status.

    :param args: ``bugfix-gym serve``'s parsed command line
    """
    import signal

    import torch

    from agents.bugfix.chat_agent import ChatAgent
    from agents.cli.flags import usage_error

    try:  # where and for whom, checked before the model is loaded
        guard = guard_from_args(args)
        listen_address(args.host, guard.allow_remote)
    except ValueError as e:
        raise usage_error("serve", str(e)) from None
    torch.set_num_threads(1)
    max_len = getattr(args, "max_model_len", None)
    agent: ChatAgent | HFChatModel
    if args.model.is_dir():
        from agents.cli.serve_hf import load_served

        if args.call_mask is not None or args.foresight is not UNSET:
            raise usage_error("serve", "--call-mask and --foresight decode a model file's call grammar; a "
                                       "save_pretrained folder answers through its chat template: drop them")
        agent, call_mask_key = load_served(args.model, "serve", max_len), None
        decoding = "its chat template, free text, tool calls read with its response template"
    else:
        model = load_model(args.model, "serve")
        model.policy.call_mask_key = None  # the default: the grammar alone (the flags below may change it)
        model.policy.foresight = None
        override_decoding(model, args, "serve")
        agent, call_mask_key = ChatAgent(model), model.policy.call_mask_key
        if max_len is not None:
            if max_len <= agent.max_call_tokens or max_len > agent.max_len:
                raise usage_error("serve", f"--max-model-len must be from {agent.max_call_tokens + 1} to the "
                                           f"model's context of {agent.max_len}, got {max_len}")
            agent.max_len = max_len
        policy = model.policy
        decoding = "free text" if policy.grammar is None else (
            f"call grammar, call mask {policy.call_mask_key or 'none'}, foresight "
            f"{'off' if policy.foresight is None else policy.foresight.threshold}")
    name = getattr(args, "served_model_name", None) or args.model_name or (
        args.model.name if args.model.is_dir() else args.model.stem)
    try:
        server = ChatServer((args.host, args.port), agent, name, call_mask_key, guard=guard)
    except OSError as e:
        raise usage_error("serve", f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another "
                                   "--port or --host") from None
    if server.remote:
        print(remote_warning(str(server.server_address[0]), guard), file=sys.stderr, flush=True)
    key = "API key required" if guard.api_key is not None else "no API key"
    print(f"serving {args.model} as model {name!r} at {server.url} ({decoding}; context {agent.max_len}; {key}); "
          "Ctrl-C or SIGTERM stops", flush=True)

    def stop(signum: int, frame: Any) -> None:  # SIGTERM (kill, a process manager): stop as Ctrl-C does
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("bugfix-gym serve: stopped", file=sys.stderr)
    finally:
        signal.signal(signal.SIGTERM, previous)
        server.server_close()
    return 0
