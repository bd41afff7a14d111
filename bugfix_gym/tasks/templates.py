"""The generator's data: the word pools identifiers are drawn from, and the templates of each split.

Each template (:class:`Template`) is a *correct* function written with placeholder identifiers, one
or more phrasings of its statement, the edit ops whose defect it can carry, and an input generator.
The ``train``, ``heldout`` and ``test`` splits hold disjoint template sets; every split covers all
five defect kinds. :mod:`bugfix_gym.tasks.generator` turns them into tasks.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

# Disjoint word pools per role, so renamed identifiers never collide inside one function
# and never shadow a builtin the templates use (min, max, len, range, sum, abs).
WORDS: dict[str, tuple[str, ...]] = {
    "xs": ("xs", "items", "values", "nums", "data", "seq", "vals", "arr", "scores", "readings"),
    "x": ("x", "v", "item", "elem", "val", "entry", "w"),
    "t": ("t", "limit", "bound", "cut", "level", "mark", "thresh", "pivot"),
    "acc": ("count", "total", "acc", "tally", "result", "running", "agg"),
    "i": ("i", "j", "k", "idx", "pos"),
    "a": ("a", "p", "num", "amount", "part", "top"),
    "b": ("b", "q", "den", "whole", "size", "base"),
    "lo": ("lo", "low", "lower", "least"),
    "hi": ("hi", "high", "upper", "most"),
    "n": ("n", "m", "stop", "upto", "end"),
}
VERBS = ("calc", "get", "find", "compute", "eval", "measure", "check", "tally", "scan", "probe")
NOUNS = ("widget", "ledger", "signal", "batch", "record", "metric", "series", "sample", "bucket", "stream")

Inputs = Callable[[np.random.Generator], list[tuple]]


@dataclass(frozen=True)
class Template:
    """A correct function with placeholder identifiers.

    :param key: the template's id (unique over all splits)
    :param statement: one line saying what the function does, with the same placeholders; or a
        tuple of such lines (phrasings), one drawn per task
    :param source: the correct function; ``{f}`` is the function name, other ``{role}`` s are
        variable names drawn from :data:`WORDS`
    :param ops: the edit ops whose defect this template can carry
    :param inputs: ``rng -> list of argument tuples``; the first three become visible tests
    """

    key: str
    statement: str | tuple[str, ...]
    source: str
    ops: tuple[str, ...]
    inputs: Inputs


def _ints(rng: np.random.Generator, k: int, lo: int = -5, hi: int = 10) -> list[int]:
    return [int(v) for v in rng.integers(lo, hi, size=k)]


def _rows(rng: np.random.Generator, lo: int, hi: int, width: int, n: int = 3) -> list[tuple[int, ...]]:
    """``n`` random tuples of ``width`` ints in [lo, hi)."""
    return [tuple(int(v) for v in row) for row in rng.integers(lo, hi, size=(n, width))]


def _lists(rng: np.random.Generator, fixed: list[list[int]], n_random: int = 4, lo: int = -5, hi: int = 10,
           min_len: int = 0) -> list[list[int]]:
    return fixed + [_ints(rng, int(rng.integers(min_len, 6)), lo, hi) for _ in range(n_random)]


def _with_threshold(rng: np.random.Generator, lists: list[list[int]]) -> list[tuple]:
    """(xs, t) pairs; t is often an item of xs, so strict vs non-strict comparisons differ."""
    out = []
    for xs in lists:
        t = int(rng.choice(xs)) if xs and rng.random() < 0.7 else int(rng.integers(-3, 8))
        out.append((xs, t))
    return out


def _count_cmp_inputs(rng: np.random.Generator) -> list[tuple]:
    return [([2, 2, 3], 2), ([5, 1, 5, 9], 5), ([], 1), *_with_threshold(rng, _lists(rng, [[4, 4]], 4))]


def _pair_inputs(rng: np.random.Generator) -> list[tuple]:
    """(a, b) pairs including zeros for b, so a missing zero guard shows."""
    fixed = [(6, 3), (7, 0), (5, 2), (0, 4), (9, 0)]
    return fixed + _rows(rng, -9, 10, 2)


def _clamp_inputs(rng: np.random.Generator) -> list[tuple]:
    fixed = [(5, 0, 3), (-2, 0, 3), (1, 0, 3), (3, 0, 3)]
    rand = []
    for _ in range(3):
        lo = int(rng.integers(-5, 5))
        rand.append((int(rng.integers(-10, 10)), lo, lo + int(rng.integers(0, 6))))
    return fixed + rand


def _n_inputs(lo: int, hi: int, fixed: list[int]) -> Inputs:
    def inputs(rng: np.random.Generator) -> list[tuple]:
        return [(n,) for n in fixed] + [(int(n),) for n in rng.integers(lo, hi, size=3)]
    return inputs


def _seq_inputs(fixed: list[list[int]], min_len: int = 0) -> Inputs:
    def inputs(rng: np.random.Generator) -> list[tuple]:
        return [(xs,) for xs in _lists(rng, fixed, 4, min_len=min_len)]
    return inputs


def _windows(rng: np.random.Generator, k: int) -> list[tuple]:
    """(xs, lo, hi) with 0 <= lo <= hi < len(xs)."""
    out = []
    for _ in range(k):
        xs = _ints(rng, int(rng.integers(1, 6)))
        lo = int(rng.integers(0, len(xs)))
        out.append((xs, lo, int(rng.integers(lo, len(xs)))))
    return out


TEMPLATES: dict[str, tuple[Template, ...]] = {
    "train": (
        Template("count_greater", "count the items of {xs} that are strictly greater than {t}", """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} > {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _count_cmp_inputs),
        Template("count_nonneg", "count the items of {xs} that are at least 0", """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        if {x} >= 0:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _seq_inputs([[0, 1, -1], [0], [], [3, -2]])),
        Template("sum_between", "return the sum of the integers from {lo} to {hi} inclusive", """
def {f}({lo}, {hi}):
    {acc} = 0
    for {i} in range({lo}, {hi} + 1):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [(1, 3), (2, 2), (0, 4), *[(int(a), int(a + d)) for a, d in rng.integers(-3, 6, size=(3, 2))]]),
        Template("product_upto", "return the product of the integers from 1 to {n} inclusive", """
def {f}({n}):
    {acc} = 1
    for {i} in range(1, {n} + 1):
        {acc} *= {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 8, [3, 1, 0, 5])),
        Template("safe_div", "return {a} divided by {b}, or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} / {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("average", "return the average of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return sum({xs}) / len({xs})
""", ("add_zero_guard",), _seq_inputs([[1, 2, 3], [], [4]], min_len=1)),
        Template("head", "return the first item of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[0]
""", ("add_zero_guard",), _seq_inputs([[3, 4], [], [9]], min_len=1)),
        Template("clip", "clamp {x} into the range from {lo} to {hi}", """
def {f}({x}, {lo}, {hi}):
    return max({lo}, min({x}, {hi}))
""", ("swap_minmax",), _clamp_inputs),
        Template("gap", "return the larger of {a} and {b} minus the smaller", """
def {f}({a}, {b}):
    return max({a}, {b}) - min({a}, {b})
""", ("swap_minmax",),
            lambda rng: [(3, 7), (5, 5), (9, 2), *_rows(rng, -9, 10, 2)]),
        Template("sum_first", "return the sum of the first {n} items of {xs}", """
def {f}({xs}, {n}):
    {acc} = 0
    for {i} in range({n}):
        {acc} += {xs}[{i}]
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [([1, 2, 3], 2), ([4, 5], 0), ([7, 1, 2], 3),
                         *[(xs, int(rng.integers(0, len(xs) + 1))) for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("count_in_window", "count the items of {xs} with {lo} <= item < {hi}", """
def {f}({xs}, {lo}, {hi}):
    {acc} = 0
    for {x} in {xs}:
        if {lo} <= {x} < {hi}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([1, 2, 3], 2, 5), ([0, 4, 2], 1, 4), ([], 0, 3),
                         *[(xs, int(rng.choice(xs)), int(rng.choice(xs)) + 3)
                           for xs in _lists(rng, [], 4, min_len=1)]]),
        # ---- added for the tools-pay work: more shapes and phrasings, several defects per template
        # (zero guards: division by a parameter or by len(), indexing at 0 / -1)
        Template("is_multiple", ("return True if {a} is a multiple of {b}, and 0 when {b} is 0",
                                 "tell whether {b} divides {a} exactly; give 0 if {b} is 0"), """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} % {b} == 0
""", ("add_zero_guard",), lambda rng: [(6, 0), (9, 3), (7, 2), (0, 5), (4, 0),
                                       *_rows(rng, -9, 10, 2)]),
        Template("ends_sum", ("return the first item of {xs} plus the last one, or 0 if {xs} is empty",
                              "add the two end items of {xs} (0 for an empty list)"), """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[0] + {xs}[-1]
""", ("add_zero_guard",), _seq_inputs([[1, 5, 2], [], [4]], min_len=1)),
        Template("mean_of_first", ("return the average of the first {n} items of {xs}, or 0 when {n} is 0",), """
def {f}({xs}, {n}):
    if not {n}:
        return 0
    return sum({xs}[:{n}]) / {n}
""", ("add_zero_guard",), lambda rng: [([4, 2, 6], 2), ([1, 2], 0), ([3, 5, 7], 3),
                                       *[(xs, int(rng.integers(0, len(xs) + 1)))
                                         for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("first_is_top", ("return True if the first item of {xs} is its largest, or 0 if {xs} is empty",
                                  "is {xs}[0] the maximum of {xs}? 0 for an empty list"), """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[0] == max({xs})
""", ("add_zero_guard", "swap_minmax"), _seq_inputs([[5, 1, 3], [], [2, 7], [4]], min_len=2)),
        Template("spread_per_item", ("return the largest item of {xs} minus the smallest, divided by the length of "
                                     "{xs}, or 0 if {xs} is empty",), """
def {f}({xs}):
    if not {xs}:
        return 0
    return (max({xs}) - min({xs})) / len({xs})
""", ("add_zero_guard", "swap_minmax"), _seq_inputs([[1, 5, 3], [], [2, 8]], min_len=2)),
        Template("share_above", ("return the fraction of the items of {xs} that are greater than {t}, or 0 if {xs} "
                                 "is empty",
                                 "what share of {xs} lies strictly above {t}? 0 for an empty list"), """
def {f}({xs}, {t}):
    if not {xs}:
        return 0
    {acc} = 0
    for {x} in {xs}:
        if {x} > {t}:
            {acc} += 1
    return {acc} / len({xs})
""", ("add_zero_guard", "fix_comparison", "fix_init"),
            lambda rng: [([1, 3, 3], 3), ([], 2), ([5, 2], 2),
                         *_with_threshold(rng, _lists(rng, [[4, 4, 1]], 3, min_len=1))]),
        Template("last_minus_first", ("return the last item of {xs} minus the first one, or 0 if {xs} is empty",), """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[-1] - {xs}[0]
""", ("add_zero_guard",), _seq_inputs([[2, 9], [], [1, 4, 6]], min_len=1)),
        Template("per_item", ("return {t} divided by the number of items of {xs}, or 0 if {xs} is empty",
                              "how much of {t} does each item of {xs} get? 0 when {xs} is empty"), """
def {f}({xs}, {t}):
    if not {xs}:
        return 0
    return {t} / len({xs})
""", ("add_zero_guard",), lambda rng: [([1, 2], 6), ([], 4), ([3], 5), *[(xs, int(rng.integers(-5, 10)))
                                                                         for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("sum_mod", ("return the sum of {xs} modulo {n}, or 0 when {n} is 0",
                             "sum {xs}, then take the remainder by {n} (0 if {n} is 0)"), """
def {f}({xs}, {n}):
    if not {n}:
        return 0
    return sum({xs}) % {n}
""", ("add_zero_guard",), lambda rng: [([3, 4], 5), ([1, 2], 0), ([9, 1], 4), ([6], 0),
                                       *[(xs, int(rng.integers(-4, 7))) for xs in _lists(rng, [], 3)]]),
        Template("sum_multiples",
                 ("return the sum of the items of {xs} that are multiples of {t}, or 0 when {t} is 0",), """
def {f}({xs}, {t}):
    if not {t}:
        return 0
    {acc} = 0
    for {x} in {xs}:
        if {x} % {t} == 0:
            {acc} += {x}
    return {acc}
""", ("add_zero_guard", "fix_init"), lambda rng: [([2, 3, 4], 2), ([1, 5], 0), ([6, 9], 3), ([], 4),
                                                  *[(xs, int(rng.integers(-3, 6))) for xs in _lists(rng, [], 3)]]),
        # (min / max in different roles)
        Template("peak_loop", ("return the largest item of the non-empty list {xs}, found with a loop",
                               "scan {xs} (never empty) and keep the biggest item"), """
def {f}({xs}):
    {acc} = {xs}[0]
    for {x} in {xs}:
        {acc} = max({acc}, {x})
    return {acc}
""", ("swap_minmax",), _seq_inputs([[1, 7, 3], [5, 2], [4]], min_len=1)),
        Template("distance", ("return the distance between {a} and {b}",
                              "how far apart are {a} and {b}? never negative"), """
def {f}({a}, {b}):
    return max({a} - {b}, {b} - {a})
""", ("swap_minmax",), lambda rng: [(2, 7), (9, 4), (3, 3), *_rows(rng, -9, 10, 2)]),
        Template("clamp_each", ("clamp every item of {xs} into the range {lo} .. {hi}",
                                "return {xs} with each item forced between {lo} and {hi}"), """
def {f}({xs}, {lo}, {hi}):
    return [max({lo}, min({x}, {hi})) for {x} in {xs}]
""", ("swap_minmax",), lambda rng: [([0, 5, 9], 2, 6), ([1, 2], 1, 2), ([], 0, 3),
                                    *[(xs, int(lo), int(lo) + 3)
                                      for xs, lo in zip(_lists(rng, [], 3), rng.integers(-3, 4, 3))]]),
        Template("smaller_abs", ("return the smaller absolute value of {a} and {b}",), """
def {f}({a}, {b}):
    return min(abs({a}), abs({b}))
""", ("swap_minmax",), lambda rng: [(3, -5), (-2, 1), (4, 4), *_rows(rng, -9, 10, 2)]),
        Template("excess", ("return how far {x} is above {t}, or 0 if it is not above",
                            "the amount by which {x} exceeds {t}, never below 0"), """
def {f}({x}, {t}):
    return max(0, {x} - {t})
""", ("swap_minmax",), lambda rng: [(7, 3), (1, 4), (2, 2), *_rows(rng, -9, 10, 2)]),
        Template("outside_by", ("return how far {x} lies outside the range {lo} to {hi}, and 0 inside it",), """
def {f}({x}, {lo}, {hi}):
    return max({lo} - {x}, 0, {x} - {hi})
""", ("swap_minmax",), _clamp_inputs),
        Template("interval_len", ("return the length of the interval from {lo} to {hi}, or 0 if it is empty",), """
def {f}({lo}, {hi}):
    return max({hi} - {lo}, 0)
""", ("swap_minmax",), lambda rng: [(1, 5), (6, 2), (3, 3), *_rows(rng, -9, 10, 2)]),
        # (range ends: one or two arguments, len(), a negative step)
        Template("count_divisors", ("count the divisors of {n} from 1 to {n}",
                                    "how many numbers between 1 and {n} inclusive divide {n} exactly?"), """
def {f}({n}):
    {acc} = 0
    for {i} in range(1, {n} + 1):
        if {n} % {i} == 0:
            {acc} += 1
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(1, 13, [6, 4, 1, 9])),
        Template("index_weighted", ("return the sum of each item of {xs} times its index",
                                    "sum of index * item over {xs}"), """
def {f}({xs}):
    {acc} = 0
    for {i} in range(len({xs})):
        {acc} += {i} * {xs}[{i}]
    return {acc}
""", ("fix_range_end", "fix_init"), _seq_inputs([[1, 2, 3], [5], [4, 0, 2]])),
        Template("neighbour_diffs", ("return the sum of the differences between neighbouring items of {xs}",), """
def {f}({xs}):
    {acc} = 0
    for {i} in range(1, len({xs})):
        {acc} += {xs}[{i}] - {xs}[{i} - 1]
    return {acc}
""", ("fix_range_end", "fix_init"), _seq_inputs([[1, 4, 9], [3, 1], [2, 5, 3, 8]])),
        Template("tail_sum", ("return the sum of the items of {xs} from index {n} to the end",
                              "add the items of {xs} at positions {n}, {n} + 1, ... up to the last"), """
def {f}({xs}, {n}):
    {acc} = 0
    for {i} in range({n}, len({xs})):
        {acc} += {xs}[{i}]
    return {acc}
""", ("fix_range_end", "fix_init"), lambda rng: [([1, 2, 3], 1), ([4, 5], 0), ([7, 1, 2], 2),
                                                 *[(xs, int(rng.integers(0, len(xs))))
                                                   for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("two_power", ("return 2 to the power {n}, by repeated doubling",), """
def {f}({n}):
    {acc} = 1
    for {i} in range({n}):
        {acc} *= 2
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 7, [3, 1, 0])),
        Template("countdown_product", ("return the product {n} * ({n} - 1) * ... * 1, counting down",), """
def {f}({n}):
    {acc} = 1
    for {i} in range({n}, 0, -1):
        {acc} *= {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 7, [3, 1, 4])),
        Template("sum_squares_to", ("return the sum of the squares of 1 .. {n}",
                                    "add {i} ** 2 for every {i} from 1 to {n}"), """
def {f}({n}):
    {acc} = 0
    for {i} in range(1, {n} + 1):
        {acc} += {i} ** 2
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 8, [2, 1, 3])),
        # (accumulators and counters)
        Template("count_negative", ("count the items of {xs} that are below 0",
                                    "how many negative numbers are in {xs}?"), """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        if {x} < 0:
            {acc} += 1
    return {acc}
""", ("fix_init", "fix_comparison"), _seq_inputs([[-1, 0, 2], [0, -3], [], [4]])),
        Template("product_nonzero", ("return the product of the nonzero items of {xs}",
                                     "multiply together the items of {xs}, skipping zeros"), """
def {f}({xs}):
    {acc} = 1
    for {x} in {xs}:
        if {x}:
            {acc} *= {x}
    return {acc}
""", ("fix_init",), _seq_inputs([[2, 0, 3], [], [5]])),
        Template("sum_abs", ("return the sum of the absolute values of the items of {xs}",), """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        {acc} += abs({x})
    return {acc}
""", ("fix_init",), _seq_inputs([[1, -2], [], [3]])),
        Template("count_between", ("count the items of {xs} that lie between {lo} and {hi}, both included",
                                   "how many items of {xs} satisfy {lo} <= item <= {hi}?"), """
def {f}({xs}, {lo}, {hi}):
    {acc} = 0
    for {x} in {xs}:
        if {lo} <= {x} <= {hi}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([1, 2, 3], 1, 2), ([0, 4, 2], 2, 4), ([], 0, 3),
                         *[(xs, int(rng.choice(xs)), int(rng.choice(xs)) + 2)
                           for xs in _lists(rng, [], 3, min_len=1)]]),
        Template("alternating_sum", ("return {xs}[0] - {xs}[1] + {xs}[2] - ... for the items of {xs}",
                                     "the alternating sum of {xs}, starting with a plus"), """
def {f}({xs}):
    {acc} = 0
    sign = 1
    for {x} in {xs}:
        {acc} += sign * {x}
        sign = -sign
    return {acc}
""", ("fix_init",), _seq_inputs([[5, 2, 1], [], [3]])),
        Template("count_changes", ("count the places where an item of {xs} differs from the one before it",), """
def {f}({xs}):
    {acc} = 0
    for {i} in range(1, len({xs})):
        if {xs}[{i}] != {xs}[{i} - 1]:
            {acc} += 1
    return {acc}
""", ("fix_init", "fix_range_end"), _seq_inputs([[1, 1, 2], [3, 4], [5, 5], [2, 7, 7, 1]])),
        Template("sum_at_least", ("return the sum of the items of {xs} that are at least {t}",
                                  "add the items of {xs} that are {t} or more"), """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} >= {t}:
            {acc} += {x}
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([2, 3, 5], 3), ([4, 1], 4), ([], 2), *_with_threshold(rng, _lists(rng, [[6, 6]], 3))]),
        # (comparisons: early returns, chains, break)
        Template("first_index_at_least", ("return the index of the first item of {xs} that is at least {t}, or -1 if "
                                          "there is none",), """
def {f}({xs}, {t}):
    for {i} in range(len({xs})):
        if {xs}[{i}] >= {t}:
            return {i}
    return -1
""", ("fix_comparison", "fix_range_end"),
            lambda rng: [([1, 4, 4], 4), ([2, 5], 5), ([3, 1], 7), *_with_threshold(rng, _lists(rng, [[0, 2, 2]], 3))]),
        Template("strictly_inside", ("return True if {x} lies strictly between {lo} and {hi}",), """
def {f}({x}, {lo}, {hi}):
    return {lo} < {x} < {hi}
""", ("fix_comparison",), lambda rng: [(2, 2, 5), (3, 1, 5), (7, 1, 5), (1, 1, 1),
                                       *[(x, lo, lo + 4) for x, lo in _rows(rng, -5, 6, 2)]]),
        Template("wins_by", ("return True if {a} beats {b} by at least {t}",
                             "does {a} exceed {b} by {t} or more?"), """
def {f}({a}, {b}, {t}):
    return {a} - {b} >= {t}
""", ("fix_comparison",), lambda rng: [(7, 4, 3), (9, 1, 2), (2, 2, 1), (5, 3, 2),
                                       *_rows(rng, -4, 8, 3)]),
        Template("last_index_below", ("return the index of the last item of {xs} that is below {t}, or -1 if there "
                                      "is none",), """
def {f}({xs}, {t}):
    for {i} in range(len({xs}) - 1, -1, -1):
        if {xs}[{i}] < {t}:
            return {i}
    return -1
""", ("fix_comparison", "fix_range_end"),
            lambda rng: [([1, 5, 3], 3), ([], 5), ([1, 4], 2), *_with_threshold(rng, _lists(rng, [[0, 3]], 3))]),
        Template("grade", ("return 2 if {x} reaches {hi}, 1 if it reaches {lo}, else 0",
                           "score {x}: 2 at {hi} or more, 1 at {lo} or more, otherwise 0"), """
def {f}({x}, {lo}, {hi}):
    if {x} >= {hi}:
        return 2
    if {x} >= {lo}:
        return 1
    return 0
""", ("fix_comparison",), lambda rng: [(5, 2, 5), (2, 2, 5), (3, 2, 5), (0, 2, 5),
                                       *[(x, lo, lo + 3) for x, lo in _rows(rng, -4, 8, 2)]]),
        Template("leading_below", ("count how many items at the start of {xs} are below {t}",
                                   "length of the longest prefix of {xs} whose items are all less than {t}"), """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} >= {t}:
            break
        {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([1, 3, 2], 3), ([2, 4], 5), ([], 1), *_with_threshold(rng, _lists(rng, [[1, 1, 4]], 3))]),
        Template("sign_of", ("return the sign of {x}: 1, -1 or 0",
                             "1 for positive {x}, -1 for negative, 0 for zero"), """
def {f}({x}):
    if {x} > 0:
        return 1
    if {x} < 0:
        return -1
    return 0
""", ("fix_comparison",), lambda rng: [(0,), (5,), (-3,), *[(int(x),) for x in rng.integers(-9, 10, 3)]]),
        Template("above_both", ("return True if {x} is greater than both {a} and {b}",), """
def {f}({x}, {a}, {b}):
    return {x} > {a} and {x} > {b}
""", ("fix_comparison",), lambda rng: [(4, 4, 1), (5, 2, 3), (1, 3, 0), (6, 6, 6),
                                       *_rows(rng, -5, 6, 3)]),

        Template("count_within", ("count the items of {xs} that are within 1 of {t}",
                                  "how many items of {xs} differ from {t} by at most 1?"), """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if abs({x} - {t}) <= 1:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"),
            lambda rng: [([1, 3, 5], 2), ([4, 6, 5], 5), ([], 0), *_with_threshold(rng, _lists(rng, [[2, 8]], 3))]),
        Template("repeat_total", ("return {t} added to itself {n} times, starting from 0",
                                  "add {t} exactly {n} times"), """
def {f}({t}, {n}):
    {acc} = 0
    for {i} in range({n}):
        {acc} += {t}
    return {acc}
""", ("fix_range_end", "fix_init"), lambda rng: [(3, 2), (5, 1), (2, 0), (4, 3),
                                                 *[(int(t), int(n))
                                                   for t, n in zip(rng.integers(-5, 8, 3), rng.integers(0, 6, 3))]]),
        # (two defects that both look plausible in the code: reading narrows the choice, the statement or a
        # test decides it)
        Template("count_squares_above", ("count the numbers from 1 to {n} inclusive whose square is greater than {t}",
                                         "how many of 1, 2, ..., {n} have a square strictly above {t}?"), """
def {f}({n}, {t}):
    {acc} = 0
    for {i} in range(1, {n} + 1):
        if {i} * {i} > {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_range_end", "fix_init"),
            lambda rng: [(3, 4), (4, 9), (2, 1),
                         *[(int(n), int(rng.integers(0, 6)) ** 2) for n in rng.integers(0, 7, 4)]]),
        Template("larger_exceeds", ("return True if the larger of {a} and {b} is greater than {t}",
                                    "is the bigger one of {a} and {b} strictly above {t}?"), """
def {f}({a}, {b}, {t}):
    return max({a}, {b}) > {t}
""", ("swap_minmax", "fix_comparison"), lambda rng: [(2, 7, 5), (5, 3, 5), (1, 2, 8),
                                                     *_rows(rng, -5, 8, 3)]),
        Template("smaller_reaches", ("return True if the smaller of {a} and {b} is at least {t}",
                                     "do both {a} and {b} reach {t}?"), """
def {f}({a}, {b}, {t}):
    return min({a}, {b}) >= {t}
""", ("swap_minmax", "fix_comparison"), lambda rng: [(4, 9, 6), (5, 7, 5), (8, 9, 2),
                                                     *_rows(rng, -5, 8, 3)]),
        Template("window_max", ("return the largest item of {xs} at positions {lo} to {hi} inclusive",
                                "the maximum of {xs}[{lo}], ..., {xs}[{hi}]"), """
def {f}({xs}, {lo}, {hi}):
    {acc} = {xs}[{lo}]
    for {i} in range({lo}, {hi} + 1):
        {acc} = max({acc}, {xs}[{i}])
    return {acc}
""", ("swap_minmax", "fix_range_end"), lambda rng: [([1, 3, 9], 0, 2), ([5, 2, 7, 4], 1, 2), ([6, 1], 0, 1),
                                                    *_windows(rng, 3)]),
        Template("capped_sum_upto", ("return the sum of min(i, {t}) for i from 1 to {n} inclusive",
                                     "add up 1, 2, ..., {n}, counting each number above {t} as {t}"), """
def {f}({n}, {t}):
    {acc} = 0
    for {i} in range(1, {n} + 1):
        {acc} += min({i}, {t})
    return {acc}
""", ("swap_minmax", "fix_range_end", "fix_init"), lambda rng: [(4, 2), (3, 5), (1, 0),
                                                                *_rows(rng, 0, 7, 2)]),
        Template("count_window_at_least", ("count the items of {xs} at positions {lo} to {hi} inclusive that are at "
                                           "least {t}",), """
def {f}({xs}, {lo}, {hi}, {t}):
    {acc} = 0
    for {i} in range({lo}, {hi} + 1):
        if {xs}[{i}] >= {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_range_end", "fix_init"),
            lambda rng: [([1, 4, 3, 4], 0, 3, 4), ([2, 5], 0, 1, 5), ([3, 3, 1], 1, 2, 3),
                         *[(xs, lo, hi, int(rng.choice(xs))) for xs, lo, hi in _windows(rng, 3)]]),
        Template("rank_from_top", ("return the rank of {t} in {xs}: 1 plus the number of items greater than {t}",
                                   "where would {t} place in {xs} from the top? 1 plus how many items beat it"), """
def {f}({xs}, {t}):
    {acc} = 1
    for {x} in {xs}:
        if {x} > {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), lambda rng: [([5, 3, 8], 5), ([], 2), ([1, 9], 4),
                                                  *_with_threshold(rng, _lists(rng, [[2, 2]], 3))]),
        Template("largest_square_within", ("return the largest i from {lo} to {hi} inclusive with i * i at most {t}, "
                                           "or 0 if there is none",), """
def {f}({lo}, {hi}, {t}):
    {acc} = 0
    for {i} in range({lo}, {hi} + 1):
        if {i} * {i} <= {t}:
            {acc} = {i}
    return {acc}
""", ("fix_comparison", "fix_range_end", "fix_init"),
            lambda rng: [(1, 3, 9), (2, 4, 3), (1, 2, 4),
                         *[(int(lo), int(lo) + int(d), int(rng.integers(0, 5)) ** 2)
                           for lo, d in rng.integers(1, 4, size=(3, 2))]]),
        Template("one_below", ("return True if at least one of {a} and {b} is below {t}",
                               "is either {a} or {b} smaller than {t}?"), """
def {f}({a}, {b}, {t}):
    return min({a}, {b}) < {t}
""", ("swap_minmax", "fix_comparison"), lambda rng: [(2, 9, 5), (5, 6, 5), (7, 8, 1),
                                                     *_rows(rng, -5, 8, 3)]),
        Template("count_capped_reaching",
                 ("count the items of {xs} that still reach {lo} after being capped at {hi}",), """
def {f}({xs}, {lo}, {hi}):
    {acc} = 0
    for {x} in {xs}:
        if min({x}, {hi}) >= {lo}:
            {acc} += 1
    return {acc}
""", ("swap_minmax", "fix_comparison", "fix_init"),
            lambda rng: [([1, 4, 9], 4, 6), ([3, 5], 5, 5), ([], 0, 2),
                         *[(xs, int(lo), int(lo) + 2) for xs, lo in zip(_lists(rng, [], 3), rng.integers(-2, 5, 3))]]),
        Template("sum_window_above", ("return the sum of the items of {xs} at positions {lo} to {hi} inclusive that "
                                      "are greater than {t}",), """
def {f}({xs}, {lo}, {hi}, {t}):
    {acc} = 0
    for {i} in range({lo}, {hi} + 1):
        if {xs}[{i}] > {t}:
            {acc} += {xs}[{i}]
    return {acc}
""", ("fix_comparison", "fix_range_end", "fix_init"),
            lambda rng: [([2, 5, 3, 6], 0, 3, 3), ([4, 4], 0, 1, 4), ([1, 7, 2], 1, 2, 1),
                         *[(xs, lo, hi, int(rng.choice(xs))) for xs, lo, hi in _windows(rng, 3)]]),
    ),
    "heldout": (
        Template("lowest", "return the smallest item of {xs}", """
def {f}({xs}):
    return min({xs})
""", ("swap_minmax",), _seq_inputs([[3, 1, 2], [5], [4, 8]], min_len=1)),
        Template("count_at_most", "count the items of {xs} that are at most {t}", """
def {f}({xs}, {t}):
    {acc} = 0
    for {x} in {xs}:
        if {x} <= {t}:
            {acc} += 1
    return {acc}
""", ("fix_comparison", "fix_init"), _count_cmp_inputs),
        Template("percent_of", "return {a} as a whole percentage of {b}, or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} * 100 // {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("sum_steps", "return the sum of 0, {b}, 2 * {b}, ... up to {n} inclusive", """
def {f}({n}, {b}):
    {acc} = 0
    for {i} in range(0, {n} + 1, {b}):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"),
            lambda rng: [(6, 2), (4, 4), (7, 3),
                         *[(int(n), int(b)) for n, b in zip(rng.integers(0, 12, 3), rng.integers(1, 4, 3))]]),
        Template("tail", "return the last item of {xs}, or 0 if {xs} is empty", """
def {f}({xs}):
    if not {xs}:
        return 0
    return {xs}[-1]
""", ("add_zero_guard",), _seq_inputs([[3, 4], [], [8]], min_len=1)),
        Template("all_below", "return True if every item of {xs} is less than {t}", """
def {f}({xs}, {t}):
    for {x} in {xs}:
        if {x} >= {t}:
            return False
    return True
""", ("fix_comparison",),
            lambda rng: [([1, 2], 3), ([1, 3], 3), ([], 0), *_with_threshold(rng, _lists(rng, [[2, 5]], 4))]),
    ),
    "test": (
        Template("strictly_rising", "return True if each item of {xs} is greater than the one before", """
def {f}({xs}):
    for {i} in range(len({xs}) - 1):
        if {xs}[{i}] >= {xs}[{i} + 1]:
            return False
    return True
""", ("fix_comparison", "fix_range_end"),
            _seq_inputs([[1, 2, 3], [1, 1, 2], [1, 3, 2], [2, 5, 5], []])),
        Template("per_unit", "return {a} split evenly into {b} parts (whole parts), or 0 when {b} is 0", """
def {f}({a}, {b}):
    if not {b}:
        return 0
    return {a} // {b}
""", ("add_zero_guard",), _pair_inputs),
        Template("saturate", "return {x}, but never more than {t}", """
def {f}({x}, {t}):
    return min({x}, {t})
""", ("swap_minmax",),
            lambda rng: [(5, 3), (1, 3), (3, 3), *_rows(rng, -9, 10, 2)]),
        Template("sum_evens_below", "return the sum of the even numbers from 0 up to but not including {n}", """
def {f}({n}):
    {acc} = 0
    for {i} in range(0, {n}, 2):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 12, [5, 7, 4, 1])),
        Template("triangle", "return 0 + 1 + ... + {n}", """
def {f}({n}):
    {acc} = 0
    for {i} in range({n} + 1):
        {acc} += {i}
    return {acc}
""", ("fix_range_end", "fix_init"), _n_inputs(0, 10, [3, 1, 0, 4])),
        Template("count_odd", "count the odd items of {xs}", """
def {f}({xs}):
    {acc} = 0
    for {x} in {xs}:
        if {x} % 2 == 1:
            {acc} += 1
    return {acc}
""", ("fix_init",), _seq_inputs([[1, 2, 3], [], [2], [5, 7]])),
        Template("first_big", "return True if the first item of {xs} exceeds {t}, or 0 if {xs} is empty", """
def {f}({xs}, {t}):
    if not {xs}:
        return 0
    return {xs}[0] > {t}
""", ("add_zero_guard",),
            lambda rng: [([5, 1], 3), ([], 2), ([3], 3), *_with_threshold(rng, _lists(rng, [], 3, min_len=1))]),
    ),
}

# train templates whose code carries two defects that both look plausible: reading narrows the choice,
# the statement or a test decides it (BugFixEnv(generated="train", ambiguous_share=...) draws them more often)
AMBIGUOUS: tuple[str, ...] = ("count_squares_above", "larger_exceeds", "smaller_reaches", "window_max",
                              "capped_sum_upto", "count_window_at_least", "rank_from_top", "largest_square_within",
                              "one_below", "count_capped_reaching", "sum_window_above")
