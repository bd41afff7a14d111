"""BugFix's vocabularies: the word-level :class:`~bugfix_gym.contract.tokenizer.Tokenizer` built from the
task library and the tool words (:func:`build_tokenizer`), and the fixed one for generated and unseen
tasks (:func:`fixed_tokenizer`).
"""

from __future__ import annotations

import re

from ..contract.tokenizer import EOC, FORMAT, NL, PAD, SPECIALS, TURN, UNK, Tokenizer, split_words  # noqa: F401
from ..edits.ops import FIX_OPS, apply_op
from ..tasks import generator
from ..tasks.library import make_tasks
from . import tools


def build_tokenizer(tasks=None) -> Tokenizer:
    """Vocabulary from the tool vocabulary plus every task's statement, sources, and test values.

    Words are kept in first-seen order, so the same tasks always give the same ids.
    """
    tasks = make_tasks("all") if tasks is None else list(tasks)
    seen: dict[str, None] = {}

    def add(text: str) -> None:
        for w in split_words(text):
            seen.setdefault(w, None)

    add(tools.VOCABULARY_TEXT)
    for task in tasks:
        add(tools.prompt(task))
        add(task.source)
        for op in FIX_OPS:  # every source one edit away, so reads after an edit stay in vocabulary
            add(apply_op(task.source, op))
        for args, expected in task.hidden:
            add(repr(args) + " " + repr(expected))
    return Tokenizer(list(seen))


# A generic Python vocabulary, so that code the task library never showed still reads as code.
PYTHON_WORDS = (
    # keywords (keyword.kwlist of Python 3.11, written out so the vocabulary does not depend on the interpreter)
    "False None True and as assert async await break class continue def del elif else except finally for "
    "from global if import in is lambda nonlocal not or pass raise return try while with yield "
    # common builtins
    "abs all any bool dict divmod enumerate filter float int isinstance len list map max min pow print "
    "range reversed round set sorted str sum tuple zip "
    # operators and punctuation (as split_words splits them)
    "+ - * / // % ** == != < <= > >= = += -= *= /= ( ) [ ] { } , : . -> ' \" ; @ & | ^ ~ !"
)
SMALL_INTS = 129  # 0 .. 128 are words; larger numbers and most floats are <unk>


def fixed_tokenizer() -> Tokenizer:
    """The fixed vocabulary for generated and unseen tasks (it does not grow with the tasks played).

    Words, in this order (first-seen order, so the ids are deterministic): the tool vocabulary
    and the nine calls; a generic Python vocabulary (:data:`PYTHON_WORDS`: keywords, common
    builtins, operators including ``//``, ``%`` and ``**``) and the integers ``0 .. 128``; the
    book's 30 tasks (as :func:`build_tokenizer` reads them); the procedural generator's
    identifier pools and the words of its ``train`` templates (statements and sources).
    Nothing of the generator's ``heldout`` / ``test`` templates is read.

    Unknown words become ``<unk>``: every generated function name (``calc_widget_3fa2b1``: one
    identifier, never a word), identifiers outside the pools, statement words that only unseen
    templates or task packs use, numbers above 128 and most floats. The agent still sees where
    an unknown word stands (one ``<unk>`` per word) and everything around it; a call the policy
    writes can never contain one that the env would accept, since every call word is known.
    """
    seen: dict[str, None] = {}

    def add(text: str) -> None:
        for w in split_words(text):
            seen.setdefault(w, None)

    add(tools.VOCABULARY_TEXT)
    add(PYTHON_WORDS)
    add(" ".join(str(i) for i in range(SMALL_INTS)))
    seen.update(dict.fromkeys(build_tokenizer(make_tasks("all")).words[len(SPECIALS):]))
    for pool in generator.WORDS.values():
        add(" ".join(pool))
    for template in generator.TEMPLATES["train"]:
        statements = (template.statement,) if isinstance(template.statement, str) else template.statement
        for text in (*statements, template.source):
            add(re.sub(r"\{(\w+)\}", r"\1", text))  # placeholders by their role names (also pool words)
    return Tokenizer(list(seen))
