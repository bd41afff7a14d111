"""``bugfix-gym serve MODEL``: an OpenAI-compatible chat server (standard library ``http.server``) that
plays a saved TinyAgent, so any OpenAI-client harness can play BugFix with it (docs/serve.md).

Routes: ``GET /health``, ``GET /v1/models`` (and ``/v1/models/NAME``), ``POST /v1/chat/completions``
(non-streaming). Each request's chat is read as a BugFix transcript
(:func:`bugfix_gym.integrations.chat.transcript_of`) and answered with ONE call of the agent
(:class:`agents.bugfix.chat_agent.ChatAgent`): a ``tool_calls`` entry when the request has ``tools``,
else the call's text. Errors are OpenAI-shaped JSON, ``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from bugfix_gym.integrations.chat import ChatError, tool_call_of, transcript_of

from agents.cli.evaluate import load_model, override_decoding

if TYPE_CHECKING:
    from agents.algorithms.on_policy import TokenOnPolicyAlgorithm
    from agents.bugfix.chat_agent import ChatAgent, WrittenCall

MAX_BODY_BYTES = 1 << 20  # a request body above this is refused (413): BugFix chats are a few KB
MAX_CHOICES = 16  # the most calls ``n`` may ask for in one request


class ApiError(Exception):
    """An error answered as OpenAI's error JSON.

    :param status: the HTTP status (400, 404, 413)
    :param message: one line: what was wrong and what to send instead
    :param code: OpenAI's machine-readable code (``invalid_value``, ``model_not_found``, ...)
    :param param: the request field at fault, if any
    """

    def __init__(self, status: int, message: str, code: str, param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.code, self.param = status, message, code, param

    def body(self) -> dict[str, Any]:
        """The error as OpenAI's JSON body."""
        kind = "not_found_error" if self.status == 404 else "invalid_request_error"
        return {"error": {"message": self.message, "type": kind, "code": self.code, "param": self.param}}


class ChatServer(ThreadingHTTPServer):
    """The HTTP server: one :class:`ChatAgent` answers every request (one call at a time).

    :param address: ``(host, port)``; port 0 picks a free one (read it from ``server_address``)
    :param agent: the agent
    :param model_name: the name ``/v1/models`` lists and requests' ``model`` must give
    :param call_mask_key: None, or the env call mask (``call_mask`` / ``useful_calls``) each request
        must send under that key, as 9 booleans over ``bugfix_gym.CALLS``
    :param log_requests: log each request to stderr (``http.server``'s format)
    """

    daemon_threads = True
    # http.server's listen backlog is 5: a harness with many rollouts in flight (verifiers runs one per
    # group member) got connection resets past it. Requests still run one at a time on the model.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], agent: ChatAgent, model_name: str,
                 call_mask_key: str | None = None, log_requests: bool = True):
        self.agent, self.model_name, self.call_mask_key = agent, model_name, call_mask_key
        self.log_requests, self.started = log_requests, int(time.time())
        super().__init__(address, ChatHandler)

    @property
    def url(self) -> str:
        """The base URL clients use (``http://host:port/v1``)."""
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}/v1" if isinstance(host, str) else f"http://{host.decode()}:{port}/v1"


@contextlib.contextmanager
def serving(model: str | Path | TokenOnPolicyAlgorithm, model_name: str = "bugfix-agent", host: str = "127.0.0.1",
            port: int = 0, **kwargs: Any) -> Iterator[ChatServer]:
    """A :class:`ChatServer` answering in a background thread for the ``with`` block, then shut down:
    ``with serving("tokenppo.zip") as server: client(base_url=server.url)``.

    :param model: a model file, or a loaded algorithm (its policy's decoding as it is)
    :param model_name: the served name
    :param host: the address (default: local only)
    :param port: the port (0: a free one)
    :param kwargs: more :class:`ChatServer` arguments (``call_mask_key``, ``log_requests``)
    """
    from agents.algorithms.presets import load_algorithm
    from agents.bugfix.chat_agent import ChatAgent

    loaded = load_algorithm(model) if isinstance(model, (str, Path)) else model
    server = ChatServer((host, port), ChatAgent(loaded), model_name, **kwargs)
    thread = threading.Thread(target=server.serve_forever, name="bugfix-gym-serve", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


class ChatHandler(BaseHTTPRequestHandler):
    """The routes; any failure is answered as error JSON, never a dropped connection."""

    protocol_version = "HTTP/1.1"  # keep-alive: every answer has a Content-Length
    timeout = 120  # seconds a connection may sit idle (or send its body) before it is closed
    server: ChatServer

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self._get)

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        self._answer(self._post)

    def _get(self) -> dict[str, Any]:
        path, name = self.path.split("?")[0].rstrip("/"), self.server.model_name
        if path == "/health":
            return {"status": "ok", "model": name}
        if path in ("/v1/models", f"/v1/models/{name}"):
            card = {"id": name, "object": "model", "created": self.server.started, "owned_by": "bugfix-gym"}
            return card if path.endswith(f"/{name}") else {"object": "list", "data": [card]}
        if path.startswith("/v1/models/"):
            raise ApiError(404, f"no model {path[len('/v1/models/'):][:80]!r}; this server serves {name!r}",
                           "model_not_found")
        raise ApiError(404, f"no route GET {path[:80]}; routes: GET /health, GET /v1/models, "
                            "POST /v1/chat/completions", "unknown_route")

    def _post(self) -> dict[str, Any]:
        path = self.path.split("?")[0].rstrip("/")
        if path != "/v1/chat/completions":
            self.close_connection = True  # the body is not read
            raise ApiError(404, f"no route POST {path[:80]}; chats go to POST /v1/chat/completions",
                           "unknown_route")
        return chat_completion(self.server, self._body())

    def _body(self) -> Any:
        """The request's JSON body (at most :data:`MAX_BODY_BYTES`)."""
        length = self.headers.get("Content-Length")
        if length is None or not length.strip().isdigit():
            self.close_connection = True
            raise ApiError(400, "the request needs a Content-Length header (chunked bodies are not read)",
                           "missing_content_length")
        if int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            raise ApiError(413, f"the request body is {int(length)} bytes, more than the {MAX_BODY_BYTES} this "
                                "server reads: send a shorter chat", "request_too_large")
        raw = self.rfile.read(int(length))
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ApiError(400, f"the request body is not JSON ({e}); send a JSON object", "invalid_json") from None
        except RecursionError:
            raise ApiError(400, "the request body nests too deeply; send a flat chat", "invalid_json") from None

    def _answer(self, route: Any) -> None:
        try:
            status, body = 200, route()
        except ApiError as e:
            status, body = e.status, e.body()
        except Exception as e:  # noqa: BLE001 - a bug answers 500 JSON; the server keeps serving
            status = 500
            body = {"error": {"message": f"internal error ({type(e).__name__}: {e})", "type": "server_error",
                              "code": "internal_error", "param": None}}
        data = json.dumps(body).encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - http.server's signature
        if self.server.log_requests:
            super().log_message(format, *args)


def chat_completion(server: ChatServer, body: Any) -> dict[str, Any]:
    """A chat completions request -> its response: the chat read as a transcript, ``n`` calls sampled.

    :param server: the server (its agent, model name and call-mask setting)
    :param body: the request's parsed JSON
    """
    from agents.bugfix.chat_agent import ContextFull

    request = read_request(body, server.model_name, server.call_mask_key)
    try:
        ids = server.agent.encode(transcript_of(request["messages"]))
    except ChatError as e:
        raise ApiError(400, str(e), "invalid_messages", "messages") from None
    except ContextFull as e:
        raise ApiError(400, str(e), "context_length_exceeded", "messages") from None
    calls = server.agent.write(ids, n=request["n"], temperature=request["temperature"], seed=request["seed"],
                               max_tokens=request["max_tokens"], open_calls=request["open_calls"])
    choices = [choice(i, call, request["tools"], request["logprobs"]) for i, call in enumerate(calls)]
    written = sum(len(call.tokens) for call in calls)
    return {"id": f"chatcmpl-{uuid.uuid4().hex}", "object": "chat.completion", "created": int(time.time()),
            "model": server.model_name, "choices": choices,
            "usage": {"prompt_tokens": len(ids), "completion_tokens": written, "total_tokens": len(ids) + written}}


def choice(index: int, call: WrittenCall, tools: bool, logprobs: bool) -> dict[str, Any]:
    """One ``choices`` entry: the call as a tool call (with ``tools``, when it is one of the env's calls),
    else as text; ``finish_reason`` ``tool_calls``, ``stop`` (ended with ``<eoc>``) or ``length``.

    :param index: the choice's index
    :param call: the sampled call
    :param tools: the request offered tools (and did not say ``tool_choice: "none"``)
    :param logprobs: add each token's log-prob (under the distribution it was sampled from)
    """
    function = tool_call_of(call.text) if tools and call.ended else None
    message: dict[str, Any] = {"role": "assistant", "content": None if function else call.text}
    if function is not None:
        message["tool_calls"] = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function", "function": function}]
    finish = "tool_calls" if function is not None else "stop" if call.ended else "length"
    content = [{"token": word, "logprob": lp, "bytes": list(word.encode("utf-8")), "top_logprobs": []}
               for word, lp in zip(call.words, call.logp)]
    return {"index": index, "message": message, "finish_reason": finish,
            "logprobs": {"content": content} if logprobs else None}


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
    if not isinstance(body.get("model"), str):
        raise ApiError(400, f"the request needs \"model\": {model_name!r}", "missing_model", "model")
    if body["model"] != model_name:
        raise ApiError(404, f"no model {body['model'][:80]!r}; this server serves {model_name!r}", "model_not_found",
                       "model")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    tools = body.get("tools")
    if tools is not None and not isinstance(tools, list):
        raise ApiError(400, "tools must be a list (bugfix_gym.integrations.chat.tool_schemas())", "invalid_type",
                       "tools")
    return dict(messages=body.get("messages"),
                n=_number(body, "n", int, 1, MAX_CHOICES, 1),
                temperature=_number(body, "temperature", float, 0.0, 2.0, 1.0),
                seed=_number(body, "seed", int, -(2**63), 2**63 - 1, None),
                max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", int, 1, None, None),
                logprobs=_flag(body, "logprobs"),
                tools=bool(tools) and body.get("tool_choice") != "none",
                open_calls=_open_calls(body, call_mask_key))


def _number(body: dict[str, Any], key: str, kind: type, low: float, high: float | None, default: Any) -> Any:
    """``body[key]`` as a ``kind`` in ``[low, high]`` (null or absent: ``default``), else a 400."""
    value = body.get(key)
    if value is None:
        return default
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value == value
    if kind is int:
        ok = ok and float(value).is_integer()
    if not ok or value < low or (high is not None and value > high):
        bound = f"from {low:g} to {high:g}" if high is not None else f"at least {low:g}"
        raise ApiError(400, f"{key} must be {'an integer' if kind is int else 'a number'} {bound}, got "
                            f"{json.dumps(value)[:40]}", "invalid_value", key)
    return kind(value)


def _flag(body: dict[str, Any], key: str) -> bool:
    """``body[key]`` as a boolean (null or absent: False), else a 400."""
    value = body.get(key)
    if value is not None and not isinstance(value, bool):
        raise ApiError(400, f"{key} must be true or false, got {json.dumps(value)[:40]}", "invalid_type", key)
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
    """Load ``args.model`` and serve it until Ctrl-C; returns the exit status.

    :param args: ``bugfix-gym serve``'s parsed command line
    """
    import torch

    from agents.bugfix.chat_agent import ChatAgent
    from agents.cli.flags import usage_error

    torch.set_num_threads(1)
    model = load_model(args.model, "serve")
    model.policy.call_mask_key = None  # the default: the grammar alone (the flags below may change it)
    model.policy.foresight = None
    override_decoding(model, args, "serve")
    name = args.model_name or args.model.stem
    try:
        server = ChatServer((args.host, args.port), ChatAgent(model), name, model.policy.call_mask_key)
    except OSError as e:
        raise usage_error("serve", f"cannot listen on {args.host}:{args.port} ({e.strerror or e}); pick another "
                                   "--port or --host") from None
    policy = model.policy
    decoding = "free text" if policy.grammar is None else (
        f"call grammar, call mask {policy.call_mask_key or 'none'}, foresight "
        f"{'off' if policy.foresight is None else policy.foresight.threshold}")
    print(f"serving {args.model} as model {name!r} at {server.url} ({decoding}); Ctrl-C stops", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        print("bugfix-gym serve: stopped", file=sys.stderr)
    finally:
        server.server_close()
    return 0
