"""The token contract: what every layer of an agent may take from ``bugfix_gym`` without knowing BugFix.

Owner codes and episode tokens (:mod:`.tokens`), the word-level :class:`~.tokenizer.Tokenizer` class
(:mod:`.tokenizer`), the bufferable text space (:mod:`.spaces`) and :func:`~.text.printable`
(:mod:`.text`). Nothing here imports the rest of the package.
"""
