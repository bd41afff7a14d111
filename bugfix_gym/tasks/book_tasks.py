"""The book's 30 tasks as data: 20 ``train`` and 10 ``heldout`` correct functions, each with the op that
repairs the defect :func:`bugfix_gym.edits.ops.inject_defect` puts in it and the inputs of its tests.

:func:`bugfix_gym.tasks.make_tasks` builds the tasks from these rows (:func:`bugfix_gym.tasks.task_from_correct`).
"""

from __future__ import annotations

from typing import Any, Sequence, Tuple

BookRow = Tuple[str, str, str, str, Sequence[Tuple[Any, ...]]]
"""(name, statement, correct source, fix_op, inputs)."""

# (name, statement, correct source, fix_op, inputs). The cases that expose each defect are
# among the inputs; tests/test_tasks.py checks the buggy source fails the hidden tests.
TRAIN: list[BookRow] = [
    ("count_above", "count the items of xs that are strictly greater than t", """
        def count_above(xs, t):
            count = 0
            for x in xs:
                if x > t:
                    count += 1
            return count
        """, "fix_comparison", [([1, 5, 3], 2), ([2, 2, 3], 2), ([], 0), ([4, 4], 4), ([7, 1, 9], 8)]),
    ("is_sorted", "return True if xs is in non-decreasing order", """
        def is_sorted(xs):
            for i in range(len(xs) - 1):
                if xs[i] > xs[i + 1]:
                    return False
            return True
        """, "fix_comparison", [([1, 2, 3],), ([1, 1, 2],), ([3, 1],), ([],), ([5, 5],), ([2, 9, 4],)]),
    ("in_range", "return True if lo <= x <= hi", """
        def in_range(x, lo, hi):
            return lo <= x <= hi
        """, "fix_comparison", [(2, 1, 5), (1, 1, 5), (9, 1, 5), (5, 1, 5), (0, 1, 5), (3, 3, 3)]),
    ("max_index", "return the index of the first largest item of xs", """
        def max_index(xs):
            best = 0
            for i in range(1, len(xs)):
                if xs[i] > xs[best]:
                    best = i
            return best
        """, "fix_comparison", [([1, 3, 2],), ([4, 1, 4],), ([2, 7, 7, 1],), ([5],), ([0, 0],), ([1, 2, 3],)]),
    ("mean", "return the average of xs, or 0 if xs is empty", """
        def mean(xs):
            if not xs:
                return 0
            return sum(xs) / len(xs)
        """, "add_zero_guard", [([1, 2, 3],), ([],), ([4],), ([2, 4],), ([-1, 1],)]),
    ("safe_ratio", "return a divided by b, or 0 when b is 0", """
        def safe_ratio(a, b):
            if not b:
                return 0
            return a / b
        """, "add_zero_guard", [(6, 3), (1, 0), (5, 2), (0, 4), (-8, 2), (3, 0)]),
    ("first", "return the first item of xs, or 0 if xs is empty", """
        def first(xs):
            if not xs:
                return 0
            return xs[0]
        """, "add_zero_guard", [([3, 4],), ([],), ([9],), ([0, 1],), ([-2, 5, 6],)]),
    ("percent", "return part as a percentage of whole, or 0 when whole is 0", """
        def percent(part, whole):
            if not whole:
                return 0
            return 100 * part / whole
        """, "add_zero_guard", [(1, 4), (3, 0), (5, 10), (0, 7), (2, 2), (9, 0)]),
    ("clamp", "clamp x into the range from lo to hi", """
        def clamp(x, lo, hi):
            return max(lo, min(x, hi))
        """, "swap_minmax", [(5, 0, 3), (-2, 0, 3), (1, 0, 3), (3, 0, 3), (10, 4, 8), (0, 0, 0)]),
    ("spread", "return the largest item of xs minus the smallest", """
        def spread(xs):
            return max(xs) - min(xs)
        """, "swap_minmax", [([1, 5, 3],), ([2],), ([7, 7],), ([-3, 4],), ([9, 0, 2],)]),
    ("cap", "return x, but never more than limit", """
        def cap(x, limit):
            return min(x, limit)
        """, "swap_minmax", [(5, 3), (1, 3), (3, 3), (-4, 0), (10, 20), (8, 2)]),
    ("larger_abs", "return the larger absolute value of a and b", """
        def larger_abs(a, b):
            return max(abs(a), abs(b))
        """, "swap_minmax", [(3, -5), (2, 1), (-4, -4), (0, 7), (6, -1)]),
    ("sum_to", "return the sum of the integers from 1 to n inclusive", """
        def sum_to(n):
            total = 0
            for i in range(1, n + 1):
                total += i
            return total
        """, "fix_range_end", [(3,), (1,), (0,), (5,), (10,)]),
    ("factorial", "return n factorial", """
        def factorial(n):
            result = 1
            for i in range(2, n + 1):
                result *= i
            return result
        """, "fix_range_end", [(3,), (0,), (1,), (5,), (6,)]),
    ("sum_list", "return the sum of the items of xs using their indices", """
        def sum_list(xs):
            total = 0
            for i in range(len(xs)):
                total += xs[i]
            return total
        """, "fix_range_end", [([1, 2, 3],), ([],), ([5],), ([4, -4, 2],), ([10, 20],)]),
    ("evens_upto", "return the even numbers from 0 to n inclusive", """
        def evens_upto(n):
            return [i for i in range(0, n + 1, 2)]
        """, "fix_range_end", [(4,), (5,), (0,), (1,), (8,)]),
    ("product", "return the product of the items of xs", """
        def product(xs):
            result = 1
            for x in xs:
                result *= x
            return result
        """, "fix_init", [([2, 3],), ([],), ([5],), ([1, 2, 3, 4],), ([-1, 7],)]),
    ("count_positive", "count the items of xs that are greater than 0", """
        def count_positive(xs):
            count = 0
            for x in xs:
                if x > 0:
                    count += 1
            return count
        """, "fix_init", [([1, -2, 3],), ([],), ([-1],), ([0, 4],), ([2, 2, 2],)]),
    ("sum_squares", "return the sum of the squares of the items of xs", """
        def sum_squares(xs):
            total = 0
            for x in xs:
                total += x * x
            return total
        """, "fix_init", [([1, 2],), ([],), ([3],), ([-2, 2],), ([1, 1, 1],)]),
    ("power", "return base raised to the integer power exp", """
        def power(base, exp):
            result = 1
            for _ in range(exp):
                result *= base
            return result
        """, "fix_init", [(2, 3), (5, 0), (3, 1), (-2, 2), (1, 9)]),
]

HELDOUT: list[BookRow] = [
    ("all_positive", "return True if every item of xs is greater than 0", """
        def all_positive(xs):
            for x in xs:
                if x <= 0:
                    return False
            return True
        """, "fix_comparison", [([1, 2],), ([0, 3],), ([],), ([-1],), ([5, 0],), ([4],)]),
    ("passes", "return True if score is at least cutoff", """
        def passes(score, cutoff):
            return score >= cutoff
        """, "fix_comparison", [(7, 5), (5, 5), (3, 5), (0, 0), (9, 10)]),
    ("average_of", "return total divided by count, or 0 when count is 0", """
        def average_of(total, count):
            if not count:
                return 0
            return total / count
        """, "add_zero_guard", [(10, 2), (4, 0), (9, 3), (0, 5), (7, 0)]),
    ("last", "return the last item of xs, or 0 if xs is empty", """
        def last(xs):
            if not xs:
                return 0
            return xs[-1]
        """, "add_zero_guard", [([3, 4],), ([],), ([8],), ([1, 2, 0],), ([-5, 6],)]),
    ("floor_at", "return x, but never less than low", """
        def floor_at(x, low):
            return max(x, low)
        """, "swap_minmax", [(1, 3), (5, 3), (3, 3), (-6, -2), (0, 9)]),
    ("min_of_three", "return the smallest of a, b and c", """
        def min_of_three(a, b, c):
            return min(a, min(b, c))
        """, "swap_minmax", [(3, 1, 2), (5, 5, 5), (-1, 4, 0), (7, 8, 6), (2, 9, 4)]),
    ("squares_upto", "return the squares of the integers from 1 to n inclusive", """
        def squares_upto(n):
            return [i * i for i in range(1, n + 1)]
        """, "fix_range_end", [(3,), (1,), (0,), (4,), (6,)]),
    ("sum_odds", "return the sum of the odd numbers from 1 to n inclusive", """
        def sum_odds(n):
            total = 0
            for i in range(1, n + 1, 2):
                total += i
            return total
        """, "fix_range_end", [(5,), (4,), (1,), (0,), (9,)]),
    ("sum_cubes", "return the sum of the cubes of the items of xs", """
        def sum_cubes(xs):
            total = 0
            for x in xs:
                total += x * x * x
            return total
        """, "fix_init", [([1, 2],), ([],), ([3],), ([-1, 1],), ([2, 2],)]),
    ("count_matches", "count the items of xs that are equal to v", """
        def count_matches(xs, v):
            count = 0
            for x in xs:
                if x == v:
                    count += 1
            return count
        """, "fix_init", [([1, 2, 1], 1), ([], 3), ([4], 5), ([7, 7, 7], 7), ([0, 1], 0)]),
]
