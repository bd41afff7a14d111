"""Chat templates run under a budget (bugfix_gym.integrations.chat_template): every template the audit used to
hang or to ask for gigabytes is a one-line refusal in bounded time, real templates render exactly as Jinja's
sandbox renders them, and the sandbox's own refusals still hold. Jinja only (torch brings it to .venv);
the tokenizer paths that use it are in tests/test_hf_tokens.py."""

from __future__ import annotations

import time

import pytest

jinja2 = pytest.importorskip("jinja2")

from bugfix_gym.integrations import chat_template  # noqa: E402
from bugfix_gym.integrations.chat_template import ChatTemplateError, render  # noqa: E402
from bugfix_gym.integrations.hf_tokenizer import CHAT_TEMPLATE, CHATML_TEMPLATE  # noqa: E402

CHAT = [{"role": "user", "content": "fix the function f"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
            "name": "edit", "arguments": {"op": "fix_init"}}}]},
        {"role": "tool", "content": "line 2 : total = 0"}]

HOSTILE = {
    "nested loops": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "loops over a set range": "{% set r = range(99999) %}{% for i in r %}{% for j in r %}{% for k in r %}"
                              "{% endfor %}{% endfor %}{% endfor %}",
    "'x' * 4e9 (as an int)": "{{ 'x' * 4000000000 }}",
    "a list times 4e9": "{{ [1] * 4000000000 }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}"
                       "{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}"
                       "{% endfor %}",
    "2 ** 1e9": "{{ 2 ** 1000000000 }}",
    "squaring": "{% set ns = namespace(n=3) %}{% for i in range(40) %}{% set ns.n = ns.n * ns.n %}{% endfor %}",
    "str.ljust(1e9)": "{{ 'x'.ljust(1000000000) }}",
    "|center(1e9)": "{{ 'x'|center(1000000000) }}",
    "|indent on many lines": "{{ ('\n' * 100000)|indent(60000) }}",
    "|format width": "{{ '%999999999d'|format(1) }}",
    "% width": "{{ '%999999999d' % 1 }}",
    "str.format width": "{{ '{:>999999999}'.format('x') }}",
    "|replace('', big)": "{{ ('x' * 100000)|replace('', 'y' * 1000) }}",
    "str.replace('', big)": "{{ ('x' * 100000).replace('', 'y' * 1000) }}",
    "join of one string 1000 times": "{% set s = 'x' * 1000000 %}{{ ([s] * 1000)|join }}",
    "str.join of one string": "{% set s = 'x' * 1000000 %}{{ ''.join([s] * 1000) }}",
    "str() of a shared list": "{% set s = 'x' * 1000000 %}{{ [s] * 1000 }}",
    "tojson with a huge indent": "{% set s = 'x' * 100000 %}{{ ([s] * 100)|tojson(indent=60000) }}",
    "expandtabs": "{{ ('\t' * 100000).expandtabs(60000) }}",
    "exponential macro calls": "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}"
                               "{{ f(40) }}",
    "a macro that writes 100 MB": "{% macro m() %}{% for i in range(100000) %}" + "L" * 1000 +
                                  "{% endfor %}{% endmacro %}{{ m() }}",
    "a set block that writes 100 MB": "{% set x %}{% for i in range(100000) %}" + "L" * 1000 +
                                      "{% endfor %}{% endset %}",
    "|sum of lists": "{{ ([[1] * 1000] * 1000)|sum(start=[]) }}",
    "infinite recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "recursive loop": "{% for x in [1, 2] recursive %}{{ loop([1, 2]) }}{% endfor %}",
    "lipsum": "{{ lipsum(1000000) }}",
    "nesting 100,000 deep": "{{ " + "(" * 100_000 + "1" + ")" * 100_000 + " }}",
    "a template of 2 MB": "x" * (2 << 20),
    "python internals": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "an underscore namespace name": "{% set ns = namespace() %}{% set ns._x = 1 %}",
    "raise_exception": "{{ raise_exception('this template refuses the chat') }}",
    "a syntax error": "{% for %}",
}


NOT_BUDGET = {"python internals", "an underscore namespace name", "raise_exception", "a syntax error",
              "lipsum"}  # lipsum is not defined here: an UndefinedError


@pytest.mark.parametrize("name", HOSTILE)
def test_a_hostile_template_is_one_line_in_bounded_time(name):
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as caught:
        render(HOSTILE[name], messages=CHAT, add_generation_prompt=True)
    assert time.monotonic() - started < chat_template.TEMPLATE_SECONDS + 1
    message = str(caught.value)
    assert "\n" not in message and len(message) < 400 and message.startswith("the chat template")
    assert caught.value.over_budget is (name not in NOT_BUDGET)  # only budget refusals are shown to serve's clients


def test_a_bomb_behind_a_long_chat_passes_a_short_one_and_stops_the_long_one():
    """The audit's loop behind ``messages|length > 2``: the first turn renders, the next is refused (it hung)."""
    bomb = ("{% if messages|length > 2 %}{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}"
            "{% endfor %}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}")
    assert render(bomb, messages=CHAT[:1]) == CHAT[0]["content"]
    with pytest.raises(ChatTemplateError, match="steps"):
        render(bomb, messages=CHAT)


@pytest.mark.parametrize("template", [CHAT_TEMPLATE, CHATML_TEMPLATE,
                                      "{{ messages|tojson(indent=2) }}{{ bos_token ~ 'x' }}{% for m in messages %}"
                                      "{{ loop.index }}{{ m.role|upper|center(12) }}{{ m.content|indent(2) }}"
                                      "{{ '%s/%d' % (m.role, loop.length) }}{{ m['content'].split(' ')|join('_') }}"
                                      "{% if loop.last %}{{ m.content.replace('0', 'zero') }}{% endif %}"
                                      "{% endfor %}{{ dict(a=1).items()|list }}{{ namespace(x=2).x * 3 }}"])
def test_real_templates_render_as_the_sandbox_renders_them(template):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    plain.globals.update(dict=dict)
    plain.filters["tojson"] = lambda x, indent=None: __import__("json").dumps(x, ensure_ascii=False, indent=indent)
    for chat in (CHAT[:1], CHAT, CHAT * 40):
        variables = dict(messages=chat, add_generation_prompt=True, bos_token="<s>")
        assert render(template, **variables) == plain.from_string(template).render(**variables)


def test_a_long_real_chat_stays_far_inside_the_budget():
    chat = (CHAT * 700)[:2000]  # 2000 messages: far more than a 1 MiB request holds
    budget = chat_template._Budget()
    token = chat_template._CURRENT.set(budget)
    try:
        "".join(chat_template._compiled(CHATML_TEMPLATE).generate(messages=chat, add_generation_prompt=True))
    finally:
        chat_template._CURRENT.reset(token)
    assert chat_template.TEMPLATE_FUEL - budget.fuel < chat_template.TEMPLATE_FUEL / 20
