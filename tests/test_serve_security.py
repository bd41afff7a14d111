"""``bugfix-gym serve``'s trust boundary (docs/serve.md "Security"): where it listens, the API key, the
connection and queue limits, request deadlines, and an OpenAI-shaped JSON answer to every hostile or broken
request, whatever its method, size or framing. Raw sockets against a server on 127.0.0.1, port 0."""

from __future__ import annotations

import contextlib
import itertools
import json
import socket
import time
from typing import Any

import gymnasium as gym
import pytest

import bugfix_gym
from agents.cli import main
from agents.cli import serve as serve_module
from agents.cli.serve import ChatServer, Turns, serving
from agents.cli.serve_guard import API_KEY_ENV, ServeGuard, guard_from_args, host_header_ok, listen_address

NAME = "tiny"


def _prompt() -> list[dict[str, str]]:
    return [{"role": "user", "content": gym.make("BugFix-v0").reset(seed=1)[0]}]


def _post(body: Any, host: str = "127.0.0.1", headers: str = "", raw: bytes | None = None) -> bytes:
    data = raw if raw is not None else json.dumps(body).encode()
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n{headers}\r\n")
    return head.encode() + data


def _read_response(sock: socket.socket) -> tuple[int, dict[str, str], bytes]:
    """One HTTP response off ``sock``: status, headers (lower-case names) and body."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed before a whole response: {data[:200]!r}")
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    length = int(headers.get("content-length", "0"))
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return status, headers, body


def _exchange(server: ChatServer, data: bytes, timeout: float = 30) -> tuple[int, dict[str, str], Any]:
    """Send ``data`` on a new connection and read one response: ``(status, headers, JSON body or None)``."""
    with socket.create_connection(server.server_address[:2], timeout=timeout) as sock:
        sock.sendall(data)
        status, headers, body = _read_response(sock)
    return status, headers, json.loads(body) if body else None


def _is_error(answer: Any, code: str) -> bool:
    error = answer["error"]
    return error["code"] == code and set(error) == {"message", "type", "code", "param"} and "\n" not in error["message"]


def _healthy(server: ChatServer) -> bool:
    return _exchange(server, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")[0] == 200


# ---------------------------------------------------------------------- where it listens
@pytest.mark.parametrize("host", ["", " ", "0", "*", "0.0", "example.com", "127.1", "0x7f.0.0.1"])
def test_a_host_that_is_no_address_is_one_line(model_file, capsys, host):
    assert main(["serve", str(model_file), "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and "--host" in err and "127.0.0.1" in err


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_beyond_loopback_needs_allow_remote(model_file, capsys, host):
    assert main(["serve", str(model_file), "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--allow-remote" in err
    assert listen_address(host, True)[1] is True


def test_allow_remote_prints_a_warning(model_file, capsys, monkeypatch):
    made = {}

    class Fake:
        remote, url, server_address = True, "http://0.0.0.0:1/v1", ("0.0.0.0", 1)

        def __init__(self, address, *args, guard=None, **kwargs):
            made.update(address=address, guard=guard)

        def serve_forever(self):
            raise KeyboardInterrupt

        def server_close(self):
            pass

    monkeypatch.setattr(serve_module, "ChatServer", Fake)  # nothing binds a public address in a test
    assert main(["serve", str(model_file), "--host", "0.0.0.0", "--allow-remote"]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and "every interface" in err and API_KEY_ENV in err
    assert made["address"] == ("0.0.0.0", 8000) and made["guard"].allow_remote


def test_loopback_addresses_listen_without_a_word():
    assert listen_address("127.0.0.1", False) == ("127.0.0.1", False)
    assert listen_address("localhost", False) == ("127.0.0.1", False)
    assert listen_address("::1", False) == ("::1", False)


# ---------------------------------------------------------------------- the API key
def test_the_api_key_guards_every_route_but_health(model_file):
    with serving(model_file, NAME, log_requests=False, guard=ServeGuard(api_key="s3cret")) as server:
        get = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n{}\r\n"
        status, headers, answer = _exchange(server, get.format("").encode())
        assert status == 401 and _is_error(answer, "invalid_api_key") and headers["www-authenticate"] == "Bearer"
        assert _exchange(server, get.format("Authorization: Bearer wrong\r\n").encode())[0] == 401
        assert _exchange(server, get.format("Authorization: Basic s3cret\r\n").encode())[0] == 401
        assert _exchange(server, get.format("Authorization: Bearer s3cret\r\n").encode())[0] == 200
        assert _exchange(server, _post(dict(model=NAME, messages=_prompt())))[0] == 401
        ok = _exchange(server, _post(dict(model=NAME, messages=_prompt()), headers="Authorization: Bearer s3cret\r\n"))
        assert ok[0] == 200 and ok[2]["choices"][0]["message"]["content"] in bugfix_gym.CALLS
        assert _healthy(server)  # a liveness probe needs no key
        # with a key, any Host may be answered: a rebinding page does not know the key
        assert _exchange(server, get.format("Authorization: Bearer s3cret\r\n").replace(
            "127.0.0.1", "evil.example").encode())[0] == 200


def test_the_api_key_comes_from_the_flag_or_the_environment():
    class Args:
        api_key = None

    assert guard_from_args(Args(), {API_KEY_ENV: "from-env"}).api_key == "from-env"
    Args.api_key = "from-flag"
    assert guard_from_args(Args(), {API_KEY_ENV: "from-env"}).api_key == "from-flag"
    Args.api_key = None
    with pytest.raises(ValueError, match="empty"):
        guard_from_args(Args(), {API_KEY_ENV: ""})  # an unset "$KEY" is refused, not taken as no key
    with pytest.raises(ValueError, match="printable"):
        ServeGuard(api_key="two words")
    guard = ServeGuard(api_key="k" * 40)
    assert guard.key_matches("Bearer " + "k" * 40) and not guard.key_matches("Bearer " + "k" * 39)
    assert not guard.key_matches(None) and ServeGuard().key_matches(None)


def test_an_empty_key_in_the_environment_is_refused_in_one_line(model_file, capsys, monkeypatch):
    monkeypatch.setenv(API_KEY_ENV, "")
    assert main(["serve", str(model_file)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and API_KEY_ENV in err


# ---------------------------------------------------------------------- Host and Content-Type
@pytest.mark.parametrize("host, ok", [("127.0.0.1", True), ("127.0.0.1:8000", True), ("localhost:8000", True),
                                      ("[::1]:8000", True), ("LOCALHOST", True), ("evil.example", False),
                                      ("evil.example:8000", False), ("", False), (None, False)])
def test_the_host_header_must_name_an_address(host, ok):
    assert host_header_ok(host, ServeGuard()) is ok


def test_a_page_on_a_rebound_name_is_refused(server):
    status, _, answer = _exchange(server, _post(dict(model=NAME, messages=_prompt()), host="evil.example:8000"))
    assert status == 400 and _is_error(answer, "invalid_host")
    status, _, answer = _exchange(server, b"GET /health HTTP/1.0\r\n\r\n")  # no Host at all
    assert status == 400 and _is_error(answer, "invalid_host")


@pytest.mark.parametrize("kind", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data", None])
def test_a_body_that_is_not_declared_json_is_refused(server, kind):
    """A browser page may post these three kinds to any address without asking first; JSON needs a CORS
    preflight, which this server never grants."""
    data = json.dumps(dict(model=NAME, messages=_prompt())).encode()
    head = f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: {len(data)}\r\n"
    head += f"Content-Type: {kind}\r\n" if kind else ""
    status, headers, answer = _exchange(server, head.encode() + b"\r\n" + data)
    assert status == 415 and _is_error(answer, "unsupported_media_type") and headers["connection"] == "close"


# ---------------------------------------------------------------------- methods, sizes, framing: all JSON
@pytest.mark.parametrize("method", ["PUT", "DELETE", "PATCH", "OPTIONS", "TRACE"])
def test_other_methods_are_405_json(server, method):
    status, headers, answer = _exchange(server, f"{method} /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                                f"Content-Length: 2\r\n\r\n{{}}".encode())
    assert status == 405 and _is_error(answer, "method_not_allowed") and headers["allow"] == "GET, POST"


def test_head_is_405_without_a_body(server):
    with socket.create_connection(server.server_address[:2], timeout=30) as sock:
        sock.sendall(b"HEAD /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        data = b""
        while b"\r\n\r\n" not in data:
            data += sock.recv(4096)
        assert data.startswith(b"HTTP/1.1 405") and data.endswith(b"\r\n\r\n")


@pytest.mark.parametrize("request_bytes, status, code", [
    (b"BREW /v1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n", 501, "unsupported_method"),
    (b"GET /" + b"a" * 70_000 + b" HTTP/1.1\r\n\r\n", 414, "request_line_too_long"),
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"X-A: b\r\n" * 150 + b"\r\n", 431, "headers_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-A: " + b"b" * 70_000 + b"\r\n\r\n", 431, "headers_too_large"),
    (b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n" + (b"X-A: " + b"b" * 1000 + b"\r\n") * 80 + b"\r\n", 431,
     "headers_too_large"),  # 80 lines of 1 KB: within http.server's own limits, beyond the 64 KiB budget
    (b"GET /health HTTP/7.0\r\n\r\n", 505, "unsupported_http_version"),
    (b"GET /health HTTP/1.1 extra\r\n\r\n", 400, "bad_request"),
])
def test_http_level_errors_are_json_too(server, request_bytes, status, code):
    got, headers, answer = _exchange(server, request_bytes)
    assert got == status and _is_error(answer, code) and headers["connection"] == "close"
    assert _healthy(server)


@pytest.mark.parametrize("headers, status, code", [
    ("Transfer-Encoding: chunked\r\n", 400, "ambiguous_framing"),  # with the Content-Length _post adds
    ("Content-Length: 5\r\n", 400, "invalid_content_length"),  # two lengths
])
def test_ambiguous_framing_is_refused_and_closes(server, headers, status, code):
    got, answer_headers, answer = _exchange(server, _post(dict(model=NAME, messages=_prompt()), headers=headers))
    assert got == status and _is_error(answer, code) and answer_headers["connection"] == "close"


@pytest.mark.parametrize("length", ["\xb2", "\u0663".encode("utf-8").decode("latin-1"), "-1", "1e3", " ", "0x10",
                                    "9" * 30])
def test_a_content_length_that_is_not_ascii_digits_is_400(server, length):
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {length}\r\n\r\n").encode("latin-1")
    status, _, answer = _exchange(server, head + b"{}")
    assert status in (400, 413) and answer["error"]["code"] in ("invalid_content_length", "request_too_large")


def test_chunked_without_a_length_is_411(server):
    head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n2\r\n{}\r\n0\r\n\r\n")
    status, _, answer = _exchange(server, head)
    assert status == 411 and _is_error(answer, "missing_content_length")


# ---------------------------------------------------------------------- client mistakes are 4xx, never 500
@pytest.mark.parametrize("raw, code", [
    (b'{"model": "tiny", "messages": [], "seed": ' + b"9" * 5000 + b"}", "invalid_json"),
    (b'{"model": "tiny", "messages": [], "temperature": NaN}', "invalid_json"),
    (b'{"model": "tiny", "messages": [], "temperature": Infinity}', "invalid_json"),
    (b'{"model": "tiny", "messages": [], "seed": 1' + b"0" * 400 + b"}", "invalid_value"),
    (b'{"model": "tiny", "messages": [], "n": 1e400}', "invalid_value"),
    (b'{"model": ' + b"[" * 500 + b"]" * 500 + b', "messages": []}', "missing_model"),
    (b'{"model": "tiny", "messages": [{"role": ' + b"[" * 900 + b"]" * 900 + b"}]}", "invalid_messages"),
    (b'{"model": "tiny", "messages": [], "logprobs": ' + b"[" * 900 + b"]" * 900 + b"}", "invalid_type"),
])
def test_malformed_numbers_and_nesting_are_400(server, raw, code):
    status, _, answer = _exchange(server, _post(None, raw=raw))
    assert status in (400, 404) and _is_error(answer, code), answer


def test_a_tiny_temperature_samples_instead_of_failing(server):
    status, _, answer = _exchange(server, _post(dict(model=NAME, messages=_prompt(), temperature=1e-300, n=4)))
    assert status == 200 and all(c["message"]["content"] in bugfix_gym.CALLS for c in answer["choices"])
    greedy = _exchange(server, _post(dict(model=NAME, messages=_prompt(), temperature=0)))[2]
    assert answer["choices"][0]["message"] == greedy["choices"][0]["message"]


@pytest.mark.parametrize("arguments", ['{"op": ' + "9" * 5000 + "}", "[" * 20_000 + "]" * 20_000,
                                       '{"op": ' + "[" * 500 + "]" * 500 + "}", '{"op": {"a": 1}}', "42"])
def test_a_malformed_tool_call_in_the_chat_is_read_as_the_invalid_call_it_was(server, arguments):
    obs = _prompt()
    chat = obs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "edit", "arguments": arguments}}]},
        {"role": "tool", "tool_call_id": "c", "content": "invalid call"}]
    status, _, answer = _exchange(server, _post(dict(model=NAME, messages=chat, temperature=0)))
    assert status == 200 and answer["choices"][0]["message"]["content"] in bugfix_gym.CALLS


class Panic(BaseException):
    """What pyo3 raises for a Rust panic (a tokenizer's): a BaseException, not an Exception."""


@pytest.mark.parametrize("error", [Panic("thread panicked at src/lib.rs"), RuntimeError("/secret/path leaked")])
def test_an_internal_failure_is_a_500_without_its_text(model_file, error, monkeypatch):
    with serving(model_file, NAME, log_requests=False) as server:
        def fail(*args, **kwargs):
            raise error

        monkeypatch.setattr(server.agent, "encode", fail)
        status, _, answer = _exchange(server, _post(dict(model=NAME, messages=_prompt())))
        assert status == 500 and _is_error(answer, "internal_error")
        assert "secret" not in json.dumps(answer) and "panicked" not in json.dumps(answer)
        assert _healthy(server)


# ---------------------------------------------------------------------- limits and deadlines
def test_past_the_connection_limit_the_accept_loop_answers_503(model_file):
    guard = ServeGuard(max_connections=2)
    with serving(model_file, NAME, log_requests=False, guard=guard) as server:
        held = [socket.create_connection(server.server_address[:2], timeout=30) for _ in range(2)]
        try:
            time.sleep(0.3)  # both accepted, each on its thread, sending nothing
            status, headers, answer = _exchange(server, _post(dict(model=NAME, messages=_prompt())))
            assert status == 503 and _is_error(answer, "server_busy") and headers["retry-after"] == "1"
            assert server.refused == 1
        finally:
            for sock in held:
                sock.close()
        # the places free up as the server's threads see the closed sockets (later on a loaded machine): a
        # chat is served again within the deadline, and until then it is refused with 503, never anything else
        deadline = time.monotonic() + 10
        statuses = [_exchange(server, _post(dict(model=NAME, messages=_prompt())))[0]]
        while statuses[-1] == 503 and time.monotonic() < deadline:
            time.sleep(0.1)
            statuses.append(_exchange(server, _post(dict(model=NAME, messages=_prompt())))[0])
        assert statuses[-1] == 200 and set(statuses[:-1]) <= {503}


class _RecordingTurns(Turns):
    """Turns that record, on the server's side, the order in which they came (tickets) and were served."""

    def __init__(self) -> None:
        super().__init__()
        self._tickets = itertools.count()
        self.served: list[int] = []

    @contextlib.contextmanager
    def turn(self):
        ticket = next(self._tickets)
        with super().turn():
            self.served.append(ticket)
            yield


def test_requests_take_the_model_in_the_order_they_came(model_file):
    """A client behind a flood waits for the requests before it, never for ever (a Lock wakes in no order). The
    order is read where the model is taken: the clients' own threads may see their answers in any order."""
    import threading

    with serving(model_file, NAME, log_requests=False) as server:
        server.turns = turns = _RecordingTurns()
        with turns.turn():  # the model is busy (ticket 0): every request below waits for its turn
            threads = []
            for k in range(6):
                threads.append(threading.Thread(target=lambda: _exchange(
                    server, _post(dict(model=NAME, messages=_prompt())))))
                threads[-1].start()
                deadline = time.monotonic() + 10
                while turns.waiting < k + 1 and time.monotonic() < deadline:
                    time.sleep(0.01)
            assert turns.waiting == 6
        for t in threads:
            t.join(timeout=60)
        assert turns.served == list(range(7))


def test_a_slow_body_is_answered_408_at_the_deadline(model_file):
    guard = ServeGuard(request_deadline_s=0.5, idle_timeout_s=5)
    with serving(model_file, NAME, log_requests=False, guard=guard) as server:
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            data = _post(dict(model=NAME, messages=_prompt()))
            sock.sendall(data[:-20])  # all but the last 20 bytes of the body
            started = time.monotonic()
            status, headers, body = _read_response(sock)
            assert status == 408 and _is_error(json.loads(body), "request_timeout")
            assert time.monotonic() - started < 3 and headers["connection"] == "close"


def test_slow_headers_are_answered_408_at_the_deadline(model_file):
    guard = ServeGuard(request_deadline_s=0.5, idle_timeout_s=5)
    with serving(model_file, NAME, log_requests=False, guard=guard) as server:
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            started = time.monotonic()
            for _ in range(4):  # a header line every 0.1 s: each read is quick, the request does not end
                sock.sendall(b"X-Slow: 1\r\n")
                time.sleep(0.1)
            status, _, body = _read_response(sock)
            assert status == 408 and _is_error(json.loads(body), "request_timeout")
            assert time.monotonic() - started < 3  # the idle timeout of each read is 5 s


def test_an_idle_connection_is_closed_after_the_idle_timeout(model_file):
    guard = ServeGuard(idle_timeout_s=0.5)
    with serving(model_file, NAME, log_requests=False, guard=guard) as server:
        with socket.create_connection(server.server_address[:2], timeout=30) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""  # closed by the server
            assert time.monotonic() - started < 3


def test_half_sent_bodies_hold_bounded_memory_and_others_are_still_served(model_file):
    """The audit's 200 half-sent 1 MiB requests: ``max_connections`` at most (the rest 503 at once), each
    holding under 1 MiB, all cut at the deadline; a client on its own connection is served meanwhile."""
    guard = ServeGuard(max_connections=8, request_deadline_s=1.0)
    with serving(model_file, NAME, log_requests=False, guard=guard) as server:
        with socket.create_connection(server.server_address[:2], timeout=30) as client:
            client.sendall(_post(dict(model=NAME, messages=_prompt())))
            assert _read_response(client)[0] == 200  # its connection is open before the flood
            slow = []
            for _ in range(40):
                sock = socket.create_connection(server.server_address[:2], timeout=30)
                head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
                        b"\r\nContent-Length: 1048576\r\n\r\n")
                with __import__("contextlib").suppress(OSError):
                    sock.sendall(head + b" " * 65536)
                slow.append(sock)
            try:
                client.sendall(_post(dict(model=NAME, messages=_prompt())))
                assert _read_response(client)[0] == 200
                assert server.refused >= 40 - 7
                answers = []
                for sock in slow:
                    try:
                        answers.append(_read_response(sock)[0])
                    except OSError:
                        answers.append(None)  # refused and reset before it was read
                assert set(answers) <= {408, 503, None} and 408 in answers
            finally:
                for sock in slow:
                    sock.close()
