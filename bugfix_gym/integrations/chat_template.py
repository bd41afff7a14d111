"""Chat templates rendered under a budget of steps, time and characters.

A chat template comes with a model or tokenizer file, so it is code from whoever wrote the file. transformers
renders it in Jinja's ``ImmutableSandboxedEnvironment``, which keeps it from files and Python's internals but
not from spending: two nested loops over ``range(100000)`` run for hours, ``'x' * 4000000000`` asks for 4 GB,
and a loop behind ``messages|length > 2`` passes a load-time check and stalls the second turn. Here a template
is checked by rendering it once more in the same sandbox with a budget, the way minijinja's *fuel* bounds
a render: every loop iteration, call, filter, attribute lookup, operator and output piece costs a step
(:data:`TEMPLATE_FUEL` in all, and :data:`TEMPLATE_SECONDS` of wall time), and every value a step would
build is sized *before* it is built (:data:`TEMPLATE_CHARS` for a string, a list or all the text the
render writes, :data:`MAX_INT_BITS` for an integer). A template over its budget, or one that fails, is a
one-line :class:`ChatTemplateError`.

:func:`render` is that budgeted render; :func:`apply_chat_template` checks a chat with it and then has the
tokenizer's own ``apply_chat_template`` encode it, with ``sanitize_control_tokens=True``: a control token
written inside a message (``<|im_end|>`` in a tool output) is encoded as plain text, so env text cannot
forge a turn. Every chat template this package renders goes through it (:mod:`.hf_tokenizer`: loading a
tokenizer, the sampler's segments, ``bugfix-gym serve``, ``bugfix-gym conformance --tokenizer``, the TRL
rollout helpers). Importing this module imports no Jinja; :func:`render` does.
"""

from __future__ import annotations

import contextvars
import datetime
import functools
import json
import time
from typing import Any, Callable, Sequence

TEMPLATE_FUEL = 1_000_000
"""Steps one render may take (a real template spends a few thousand on a long chat)."""
CALL_STEPS = 4
"""Steps a call costs (a few times the work of a loop iteration)."""
MACRO_STEPS = 16
"""Steps a call of one of the template's own macros costs (a new frame and context: ~20 times an iteration)."""
TEMPLATE_SECONDS = 5.0
"""Wall time one render may take (the fuel is the deterministic limit; this is the backstop)."""
TEMPLATE_CHARS = 8 << 20
"""The longest string or list a render may build, and all the text it may write (its output pieces
counted wherever they are written: a macro's or a ``set`` block's too)."""
MAX_INT_BITS = 4096
"""The largest integer a template may compute (``2 ** 10 ** 9`` would take minutes and a gigabyte)."""
MAX_TEMPLATE_CHARS = 1 << 20
"""The longest chat template accepted (real ones are a few KB to tens of KB)."""
MAX_SIZE_ARG = 1 << 16
"""The largest width or count a size-making filter or method takes (``center``, ``indent``, ``ljust``, ...)."""
_NEST = 64  # containers sized deeper than this are refused


class ChatTemplateError(ValueError):
    """A chat template that exceeds its budget or fails to render; the message is one line.

    :param message: what went wrong
    :param over_budget: the template exceeded its budget (the message then holds nothing but this module's
        words; else it may quote the template's or the tokenizer's own error)
    """

    def __init__(self, message: str, over_budget: bool = False):
        super().__init__(message)
        self.over_budget = over_budget


class _Budget:
    """What one render may still spend."""

    __slots__ = ("fuel", "chars", "deadline")

    def __init__(self) -> None:
        self.fuel = TEMPLATE_FUEL
        self.chars = TEMPLATE_CHARS
        self.deadline = time.monotonic() + TEMPLATE_SECONDS

    def spend(self, steps: int = 1) -> None:
        self.fuel -= steps
        if self.fuel < 0:
            raise ChatTemplateError(f"the chat template takes more than {TEMPLATE_FUEL} steps to render this chat "
                                    "(nested or unbounded loops?); use a template whose work follows the chat's length",
                                    over_budget=True)
        if time.monotonic() > self.deadline:
            raise ChatTemplateError(f"the chat template takes more than {TEMPLATE_SECONDS:g} s to render this chat; "
                                    "use a template whose work follows the chat's length", over_budget=True)

    def write(self, chars: int) -> None:
        self.chars -= chars
        if self.chars < 0:
            raise ChatTemplateError(f"the chat template writes more than {TEMPLATE_CHARS} characters for this chat",
                                    over_budget=True)


_CURRENT: contextvars.ContextVar[_Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def _budget() -> _Budget:
    budget = _CURRENT.get()
    if budget is None:  # a compiled template is only ever run by render(), which sets one
        raise ChatTemplateError("a budgeted chat template ran outside render()")
    return budget


def _too_big(what: str, size: float, limit: float = TEMPLATE_CHARS) -> None:
    if size > limit:
        unit = "bits" if "integer" in what else "items"
        raise ChatTemplateError(f"the chat template builds {what} of about {size:.3g} {unit}, more than the {limit} "
                                "allowed", over_budget=True)


def _size(value: Any) -> int:
    """An upper bound on ``len(str(value))`` (strings in containers count 4 a character: their repr escapes),
    stopping as soon as it passes :data:`TEMPLATE_CHARS`; a shared container counts each time it appears,
    as ``str`` writes it each time."""
    if isinstance(value, str):
        return len(value)
    from jinja2.runtime import Undefined
    from jinja2.utils import Namespace

    return _nested_size(value, 0, {}, Undefined, Namespace)


def _nested_size(value: Any, depth: int, memo: dict[int, int], undefined: type, namespace: type) -> int:
    if isinstance(value, str):
        return 4 * len(value) + 2
    if isinstance(value, bool) or value is None:
        return 5
    if isinstance(value, int):
        return value.bit_length() // 3 + 2
    if isinstance(value, float):
        return 24
    if isinstance(value, undefined):
        return 0
    key = id(value)
    if key in memo:
        return memo[key]
    if depth > _NEST:
        raise ChatTemplateError(f"the chat template writes a value nested more than {_NEST} levels deep",
                                over_budget=True)
    memo[key] = 5  # a container inside itself writes as [...]
    if isinstance(value, namespace):
        items: Any = [value._Namespace__attrs]  # type: ignore[attr-defined]
    elif isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ in (
            "dict_keys", "dict_values", "dict_items"):
        items = list(value)
    else:
        items = []  # a macro, a loop, a cycler: a short repr
    total = 64 + 4 * len(items)
    for item in items:
        total += _nested_size(item, depth + 1, memo, undefined, namespace)
        if total > TEMPLATE_CHARS:
            break
    memo[key] = total
    return total


def _json_bound(value: Any, indent: Any) -> int:
    """An upper bound on ``json.dumps(value, indent=indent)``: the value's size, and per item (a line when
    indented) its depth times the indent."""
    width = len(indent) if isinstance(indent, str) else int(indent or 0)
    size, items, depth, stack = _size(value), 0, 0, [(value, 0)]
    while stack and items <= TEMPLATE_CHARS:
        v, d = stack.pop()
        items, depth = items + 1, max(depth, d)
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend((x, d + 1) for x in v)
    return 2 * size + items * (depth + 1) * (width + 1)


def _check_size(what: str, value: Any) -> None:
    """Refuse a value (a filter's or a call's result) larger than the budget, or an integer too wide."""
    if isinstance(value, int) and not isinstance(value, bool):
        _too_big("an integer", value.bit_length(), MAX_INT_BITS)
    elif isinstance(value, (str, list, tuple, dict)):
        _too_big(what, len(value))


def _format_bound(fmt: str, args: Sequence[Any]) -> int:
    """An upper bound on ``fmt % args`` or ``fmt.format(...)``: every field written as the widest argument,
    padded to the widest number in the format string."""
    import re

    widths = [int(w) for w in re.findall(r"\d+", fmt)] or [0]
    if max(widths) > MAX_SIZE_ARG:
        raise ChatTemplateError(f"the chat template formats with a width of {max(widths)}, more than {MAX_SIZE_ARG}",
                                over_budget=True)
    fields = fmt.count("%") + fmt.count("{")
    widest = max([_size(a) for a in args] or [0])
    return len(fmt) + fields * (widest + max(widths))


def _binop_bound(operator: str, left: Any, right: Any) -> None:
    """Refuse an operator whose result would pass the budget, before it is computed."""
    sized = (str, list, tuple)
    if operator == "+" and isinstance(left, sized) and isinstance(right, sized):
        _too_big("a string or list", len(left) + len(right))
    elif operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, sized) and isinstance(n, int):
                _too_big("a string or list", len(seq) * max(n, 0))
        if isinstance(left, int) and isinstance(right, int):
            _too_big("an integer", left.bit_length() + right.bit_length(), MAX_INT_BITS)
    elif operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1 and right > 0:
        _too_big("an integer", right * left.bit_length(), MAX_INT_BITS)
    elif operator == "%" and isinstance(left, str):
        _too_big("a string", _format_bound(left, right if isinstance(right, (tuple, list)) else
                                           list(right.values()) if isinstance(right, dict) else [right]))


def _size_args(name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> None:
    for value in [*args, *kwargs.values()]:
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SIZE_ARG:
            raise ChatTemplateError(f"the chat template's {name} asks for {value}, more than {MAX_SIZE_ARG}",
                                    over_budget=True)


def _lines(s: Any) -> int:
    return str(s).count("\n") + 1


def _replace_bound(s: Any, old: Any, new: Any) -> int:
    s, old, new = str(s), str(old), str(new)
    hits = len(s) + 1 if not old else s.count(old)
    return len(s) + hits * len(new)


def _join_bound(items: Sequence[Any], sep: Any) -> int:
    return sum(_size(x) for x in items) + len(str(sep)) * len(items)


def _arg(a: Sequence[Any], k: dict[str, Any], index: int, name: str, default: Any) -> Any:
    """A filter's argument ``name``, given by keyword or at ``index`` after the value."""
    return k.get(name, a[index] if len(a) > index else default)


def _indent_bound(v: Any, a: Sequence[Any], k: dict[str, Any]) -> int:
    width = _arg(a, k, 0, "width", 4)
    return len(str(v)) + _lines(v) * (len(width) if isinstance(width, str) else int(width))


#: filters that can write more than they read, and a bound on what they write (value, args, kwargs)
_FILTER_BOUNDS: dict[str, Callable[[Any, Sequence[Any], dict[str, Any]], int]] = {
    "center": lambda v, a, k: len(str(v)) + int(_arg(a, k, 0, "width", 80)),
    "indent": _indent_bound,
    "wordwrap": lambda v, a, k: len(str(v)) * (2 + len(str(_arg(a, k, 2, "wrapstring", "") or ""))),
    "replace": lambda v, a, k: _replace_bound(v, _arg(a, k, 0, "old", ""), _arg(a, k, 1, "new", "")),
    "format": lambda v, a, k: _format_bound(str(v), [*a, *k.values()]),
    "tojson": lambda v, a, k: _json_bound(v, _arg(a, k, 1, "indent", None)),
    "pprint": lambda v, a, k: 2 * _size(v),
    "string": lambda v, a, k: _size(v),
    "list": lambda v, a, k: _size(v) if isinstance(v, str) else 0,
    "escape": lambda v, a, k: 6 * _size(v),
    "e": lambda v, a, k: 6 * _size(v),
    "forceescape": lambda v, a, k: 6 * _size(v),
    "urlencode": lambda v, a, k: 12 * _size(v),
    "xmlattr": lambda v, a, k: 6 * _size(v),
    "truncate": lambda v, a, k: len(str(v)) + len(str(_arg(a, k, 2, "end", "..."))),
}
_SIZE_FILTERS = {"center", "indent", "wordwrap", "truncate", "batch", "slice", "tojson", "round"}


def _guard_filter(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
    """``function`` (a Jinja filter) costing a step, its size arguments and its result checked."""
    from jinja2.utils import _PassArg

    skip = 0 if _PassArg.from_obj(function) is None else 1  # the context / environment comes first

    @functools.wraps(function)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        budget = _budget()
        value, rest = args[skip] if len(args) > skip else None, list(args[skip + 1:])
        budget.spend(1 + (len(value) // 8 if isinstance(value, (str, list, tuple, dict)) else 0))
        if name in _SIZE_FILTERS:
            _size_args(f"|{name}", rest, kwargs)
        if name == "sum" and not isinstance(kwargs.get("start", rest[1] if len(rest) > 1 else 0), (int, float)):
            raise ChatTemplateError("the chat template sums lists or strings (|sum(start=...)), which takes time "
                                    "quadratic in their length; use |join", over_budget=True)
        if name == "join" and not isinstance(value, (str, dict)):
            value = list(value) if value is not None else value
            args = (*args[:skip], value, *args[skip + 1:])
            if isinstance(value, list):
                _too_big("a string", _join_bound(value, rest[0] if rest else kwargs.get("d", "")))
        bound = _FILTER_BOUNDS.get(name)
        if bound is not None:
            _too_big("a string", bound(value, rest, kwargs))
        result = function(*args, **kwargs)
        _check_size(f"a |{name} result", result)
        return result

    return guarded


def _check_call(obj: Any, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Refuse a method call whose result would pass the budget; returns the arguments to call it with."""
    owner, name = getattr(obj, "__self__", None), getattr(obj, "__name__", "")
    if not isinstance(owner, str):
        return args
    if name in ("center", "ljust", "rjust", "zfill", "expandtabs"):
        _size_args(f"str.{name}", args, kwargs)
        if name == "expandtabs":
            _too_big("a string", len(owner) + owner.count("\t") * int((list(args) or [8])[0]))
    elif name == "join" and args:
        items = list(args[0])
        _too_big("a string", _join_bound(items, owner))
        return (items, *args[1:])
    elif name == "replace" and len(args) >= 2:
        _too_big("a string", _replace_bound(owner, args[0], args[1]))
    elif name == "translate" and args:
        table = args[0]
        widest = max([len(v) if isinstance(v, str) else 1 for v in table.values()] or [1]) if isinstance(
            table, dict) else 1
        _too_big("a string", len(owner) * widest)
    elif name == "encode":
        _too_big("a string", 4 * len(owner))
    return args


@functools.lru_cache(maxsize=None)
def _environment() -> Any:
    """The budgeted sandbox: transformers' chat-template environment (``ImmutableSandboxedEnvironment``,
    ``trim_blocks``, ``lstrip_blocks``, loop controls, ``{% generation %}``, its globals and ``tojson``), with
    every call, attribute lookup, item lookup, filter and ``+ * % **`` costing a step and sized first."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(Extension):
        """``{% generation %}...{% endgeneration %}`` (transformers' assistant-mask tag): renders its body."""

        tags = {"generation"}

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller: Any) -> Any:
            return caller()

    class Budgeted(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset(("+", "*", "%", "**"))  # also keeps them from being folded at compile time

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _budget().spend()
            _binop_bound(operator, left, right)
            return super().call_binop(context, operator, left, right)

        def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: N805 - Jinja's
            _budget().spend(MACRO_STEPS if isinstance(__obj, jinja2.runtime.Macro) else CALL_STEPS)
            args = tuple(_check_call(__obj, args, kwargs))
            result = super().call(__context, __obj, *args, **kwargs)
            _check_size("a call's result", result)
            return result

        def wrap_str_format(self, value: Any) -> Any:
            """``str.format`` / ``format_map``, which the sandbox wraps at attribute access, sized first."""
            wrapped = super().wrap_str_format(value)
            if wrapped is None:
                return None
            fmt, mapping = value.__self__, value.__name__ == "format_map"

            def checked(*args: Any, **kwargs: Any) -> Any:
                values = list(args[0].values()) if mapping and args and isinstance(args[0], dict) else \
                    [*args, *kwargs.values()]
                _too_big("a string", _format_bound(fmt, values))
                return wrapped(*args, **kwargs)

            return checked

        def getattr(self, obj: Any, attribute: str) -> Any:
            _budget().spend()
            return super().getattr(obj, attribute)

        def getitem(self, obj: Any, argument: Any) -> Any:
            _budget().spend()
            return super().getitem(obj, argument)

    class TemplateNamespace(jinja2.utils.Namespace):
        """``namespace()`` that refuses underscore names, as transformers' does."""

        def __init__(*args: Any, **kwargs: Any) -> None:  # noqa: N805 - Jinja's signature trick
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name: str, value: Any) -> None:
            TemplateNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name: Any) -> None:
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(f"namespace attribute {name!r} starts with an underscore")

    class TemplateDict:
        def __call__(self, *args: Any, **kwargs: Any) -> dict:
            return dict(*args, **kwargs)

        def fromkeys(self, *args: Any, **kwargs: Any) -> dict:
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message: Any) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def strftime_now(fmt: Any) -> str:
        _too_big("a string", 16 * len(str(fmt)))
        return datetime.datetime.now().strftime(fmt)

    def tojson(x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None,
               sort_keys: bool = False) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    @jinja2.pass_context
    def budget_iter(context: Any, value: Any) -> Any:
        budget = _budget()
        for item in value:
            budget.spend()
            yield item

    @jinja2.pass_context
    def budget_out(context: Any, value: Any) -> Any:
        size = _size(value)
        _too_big("an output", size)
        budget = _budget()
        budget.spend()
        budget.write(size)
        return value

    @jinja2.pass_context
    def budget_concat(context: Any, values: list[Any]) -> str:
        _too_big("a string", sum(_size(v) for v in values))
        _budget().spend()
        return "".join(str(v) for v in values)

    env = Budgeted(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])
    env.filters["tojson"] = tojson
    env.filters = {name: _guard_filter(name, f) for name, f in env.filters.items()}
    env.filters.update(_bugfix_iter=budget_iter, _bugfix_out=budget_out, _bugfix_concat=budget_concat)
    env.globals.pop("lipsum", None)  # lipsum(n) writes n paragraphs: no template needs it
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=TemplateDict(),
                       namespace=TemplateNamespace)
    return env


def _instrument(env: Any, source: str) -> Any:
    """``source`` parsed, every ``for`` loop's iterable, output piece and ``~`` routed through the budget."""
    from jinja2 import nodes

    ast = env.parse(source)

    def hook(node: Any, name: str) -> Any:
        return nodes.Filter(node, name, [], [], None, None, lineno=node.lineno)

    for parent in list(ast.find_all(nodes.Node)):  # ~ joins without a hook: one filter per concatenation
        for field in parent.fields:
            child = getattr(parent, field)
            if isinstance(child, nodes.Concat):
                setattr(parent, field, hook(nodes.List(child.nodes, lineno=child.lineno), "_bugfix_concat"))
            elif isinstance(child, list):
                setattr(parent, field, [hook(nodes.List(c.nodes, lineno=c.lineno), "_bugfix_concat")
                                        if isinstance(c, nodes.Concat) else c for c in child])
    for loop in ast.find_all(nodes.For):
        loop.iter = hook(loop.iter, "_bugfix_iter")
    for output in ast.find_all(nodes.Output):
        output.nodes = [hook(nodes.Const(c.data, lineno=c.lineno) if isinstance(c, nodes.TemplateData) else c,
                             "_bugfix_out") for c in output.nodes]
    ast.set_environment(env)
    return ast


@functools.lru_cache(maxsize=32)
def _compiled(source: str) -> Any:
    env = _environment()
    return env.template_class.from_code(env, env.compile(_instrument(env, source)), env.make_globals(None), None)


def render(template: str, **variables: Any) -> str:
    """``template`` rendered with ``variables`` under the budget (the module docstring).

    :param template: the chat template (Jinja source)
    :param variables: what the template sees (``messages``, ``add_generation_prompt``, the special tokens, ...)
    :raises ChatTemplateError: the template is too long, does not compile, exceeds its budget or fails (one line)
    """
    if not isinstance(template, str):
        raise ChatTemplateError("the chat template must be text")
    if len(template) > MAX_TEMPLATE_CHARS:
        raise ChatTemplateError(f"the chat template is {len(template)} characters, more than the "
                                f"{MAX_TEMPLATE_CHARS} accepted", over_budget=True)
    token = _CURRENT.set(_Budget())
    try:
        return "".join(_compiled(template).generate(**variables))
    except ChatTemplateError:
        raise
    except RecursionError:
        raise ChatTemplateError("the chat template recurses (or nests) too deeply to render",
                                over_budget=True) from None
    except MemoryError:
        raise ChatTemplateError("the chat template ran out of memory", over_budget=True) from None
    except Exception as err:  # noqa: BLE001 - Jinja's SecurityError, TemplateError, an error of the template's own
        first = str(err).splitlines()[0][:160] if str(err) else ""
        raise ChatTemplateError(f"the chat template does not render ({type(err).__name__}: {first})") from None
    finally:
        _CURRENT.reset(token)


def template_variables(tokenizer: Any, messages: Sequence[dict[str, Any]], add_generation_prompt: bool) -> dict:
    """What transformers' ``apply_chat_template`` shows a template: the messages without keys set to None,
    ``tools``, ``documents``, ``add_generation_prompt`` and the tokenizer's special tokens."""
    chat = [{k: v for k, v in m.items() if v is not None} for m in messages]
    specials = dict(getattr(tokenizer, "special_tokens_map", None) or {})
    return dict(specials, messages=chat, tools=None, documents=None, add_generation_prompt=add_generation_prompt)


def apply_chat_template(tokenizer: Any, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = False
                        ) -> list[int]:
    """The ids of ``messages`` in ``tokenizer``'s chat template: checked by :func:`render` first, then encoded
    by the tokenizer's own ``apply_chat_template`` with ``sanitize_control_tokens=True`` (a control token
    inside a message is plain text).

    :param tokenizer: a ``transformers`` tokenizer with a chat template
    :param messages: the chat
    :param add_generation_prompt: end with the template's prompt for the next assistant turn
    :raises ChatTemplateError: the template exceeds its budget or fails, or the tokenizer's native code fails
        (a Rust panic is a ``BaseException``) (one line)
    """
    template = tokenizer.get_chat_template() if hasattr(tokenizer, "get_chat_template") else tokenizer.chat_template
    render(template, **template_variables(tokenizer, messages, add_generation_prompt))
    try:
        ids = tokenizer.apply_chat_template(list(messages), add_generation_prompt=add_generation_prompt, tokenize=True,
                                            return_dict=False, sanitize_control_tokens=True)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as err:  # noqa: BLE001 - tokenizers' Rust panics are BaseExceptions
        first = str(err).splitlines()[0][:160] if str(err) else ""
        raise ChatTemplateError(f"the tokenizer cannot encode this chat ({type(err).__name__}: {first})") from None
    return [int(i) for i in ids]
