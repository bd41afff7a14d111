"""The defect classes BugFix-v1's injections stand for: the 14 classes of the QuixBugs taxonomy (Lin et al. 2017,
Table 1) and the 6 bug types of HumanEvalFix (Muennighoff et al. 2023), each mapped to the injection families
(:mod:`bugfix_gym.edits.inject`) that produce it, with one example (correct -> buggy, and the repair call).

A table, used by the docs and by reports; :data:`FAMILIES` is the inverse (family -> the classes it stands for),
which every :class:`~bugfix_gym.edits.inject.Injection` carries.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping


@dataclass(frozen=True)
class DefectClass:
    """One defect class and how the engine produces it, with an example that ``injections`` of ``correct``
    produces (checked by a test).

    :param name: the class as its taxonomy names it
    :param taxonomy: ``"QuixBugs"`` or ``"HumanEvalFix"``
    :param families: the injection families that produce it, the one of the example first
    :param correct: a small correct function (normalised source)
    :param buggy: the same function with the defect
    :param repair: the call that repairs it
    """

    name: str
    taxonomy: str
    families: tuple[str, ...]
    correct: str
    buggy: str
    repair: str


_TOTAL = "def total(xs):\n    t = 0\n    for x in xs:\n        t += x\n    return t\n"
_UNIQ = ("def uniq(xs):\n    seen = set()\n    out = []\n    for x in xs:\n        if x not in seen:\n"
         "            seen.add(x)\n            out.append(x)\n    return out\n")
_POS = "def pos(xs):\n    out = []\n    for x in xs:\n        if x > 0:\n            out.append(x)\n    return out\n"

DEFECT_CLASSES: tuple[DefectClass, ...] = (
    DefectClass("incorrect assignment operator", "QuixBugs", ("op_assign",),
                _TOTAL, _TOTAL.replace("t += x", "t = x"), "edit 4.0 op +="),
    DefectClass("incorrect variable", "QuixBugs", ("var_replace",),
                "def span(lo, hi):\n    return hi - lo\n", "def span(lo, hi):\n    return lo - lo\n",
                "edit 2.2 name n1"),
    DefectClass("incorrect comparison operator", "QuixBugs", ("op_compare",),
                "def below(xs, k):\n    return [x for x in xs if x < k]\n",
                "def below(xs, k):\n    return [x for x in xs if x <= k]\n", "edit 2.5 op <"),
    DefectClass("missing condition", "QuixBugs", ("cond_drop", "cond_true", "negate_drop"),
                "def keep(xs, seen, on):\n    return [x for x in xs if x not in seen and on]\n",
                "def keep(xs, seen, on):\n    return [x for x in xs if x not in seen]\n", "edit 2.5 extend_and n2"),
    DefectClass("missing/added +1", "QuixBugs", ("plus1_missing", "plus1_added"),
                "def upto(n):\n    return list(range(n + 1))\n", "def upto(n):\n    return list(range(n))\n",
                "edit 2.5 plus1"),
    DefectClass("variable swap", "QuixBugs", ("operand_swap",),
                "def at(a, i, j):\n    return a[i][j]\n", "def at(a, i, j):\n    return a[j][i]\n", "edit 2.1 swap"),
    DefectClass("incorrect array slice", "QuixBugs", ("slice_drop", "slice_add"),
                "def rest(xs):\n    return sum(xs[1:])\n", "def rest(xs):\n    return sum(xs)\n",
                "edit 2.3 slice_from 1"),
    DefectClass("variable prepend", "QuixBugs", ("prepend",),
                "def digits(n):\n    out = ''\n    while n:\n        out = str(n % 10) + out\n        n //= 10\n"
                "    return out\n",
                "def digits(n):\n    out = ''\n    while n:\n        out = out + str(n % 10)\n        n //= 10\n"
                "    return out\n", "edit 4.2 swap"),
    DefectClass("incorrect data structure constant", "QuixBugs", ("listify_drop", "const_change", "listify_add"),
                "def empty_sets():\n    return [[]]\n", "def empty_sets():\n    return []\n", "edit 2.1 listify"),
    DefectClass("incorrect method called", "QuixBugs", ("method_replace",),
                "def shout(s):\n    return s.upper()\n", "def shout(s):\n    return s.lower()\n",
                "edit 2.2 attr upper"),
    DefectClass("incorrect field dereference", "QuixBugs", ("field_replace",),
                "def pair(node):\n    return (node.value, node.next.value)\n",
                "def pair(node):\n    return (node.next, node.next.value)\n", "edit 2.2 attr n2"),
    DefectClass("missing arithmetic expression", "QuixBugs", ("arith_drop",),
                "def scale(x, k):\n    return x * k\n", "def scale(x, k):\n    return x\n", "edit 2.1 extend_mul n1"),
    DefectClass("missing function call", "QuixBugs", ("call_drop",),
                "def ordered(xs):\n    return [x for x in sorted(xs)]\n",
                "def ordered(xs):\n    return [x for x in xs]\n", "edit 2.4 wrap sorted"),
    DefectClass("missing line", "QuixBugs", ("line_drop",),
                _UNIQ, _UNIQ.replace("            seen.add(x)\n", ""), "insert 6 seen.add(x)"),
    DefectClass("value misuse", "HumanEvalFix", ("const_change", "plus1_added", "plus1_missing"),
                _TOTAL, _TOTAL.replace("t = 0", "t = 1"), "edit 2.2 const 0"),
    DefectClass("missing logic", "HumanEvalFix", ("call_drop", "cond_drop", "cond_true", "negate_drop", "arith_drop",
                                                  "line_drop"),
                "def dist(a, b):\n    return abs(a - b)\n", "def dist(a, b):\n    return a - b\n", "edit 2.1 wrap abs"),
    DefectClass("excess logic", "HumanEvalFix", ("negate_add", "cond_add", "call_add", "line_dup"),
                _POS, _POS.replace("if x > 0", "if not x > 0"), "edit 4.1 unwrap c0"),
    DefectClass("operator misuse", "HumanEvalFix", ("op_arith", "op_compare", "op_bool"),
                "def diff(a, b):\n    return a - b\n", "def diff(a, b):\n    return a + b\n", "edit 2.1 op -"),
    DefectClass("variable misuse", "HumanEvalFix", ("operand_swap", "var_replace", "prepend"),
                "def diff(x, y):\n    return x - y\n", "def diff(x, y):\n    return y - x\n", "edit 2.1 swap"),
    DefectClass("function misuse", "HumanEvalFix", ("call_replace", "method_replace", "field_replace"),
                "def top(xs):\n    return max(xs)\n", "def top(xs):\n    return min(xs)\n", "edit 2.2 name max"),
)
"""The 14 QuixBugs classes then the 6 HumanEvalFix types."""


def _families() -> Mapping[str, tuple[str, ...]]:
    out: dict[str, list[str]] = {}
    for cls in DEFECT_CLASSES:
        for family in cls.families:
            out.setdefault(family, []).append(cls.name)
    return MappingProxyType({family: tuple(names) for family, names in out.items()})


FAMILIES: Mapping[str, tuple[str, ...]] = _families()
"""Injection family -> the defect classes it stands for."""


def classes_of(family: str) -> tuple[str, ...]:
    """The defect classes an injection family stands for (KeyError for an unknown family)."""
    return FAMILIES[family]
