"""The bounded chat-template sandbox: every way a template can build a huge value or run without
end stops with `RenderLimitExceeded`, promptly and before memory is spent; ordinary template
features render as in the plain sandbox; each render's budget is its own thread's."""

from __future__ import annotations

import json
import threading
import time
import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from helios.core.template_sandbox import BoundedSandbox, RenderBounds, RenderLimitExceeded, TemplateRaised, render_bounded

BOUNDS = RenderBounds(max_chars=1 << 20, cpu_seconds=0.3)
MESSAGES = [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]


def render(source: str, bounds: RenderBounds = BOUNDS, **variables) -> str:
    return render_bounded(BoundedSandbox().from_string(source), {"messages": MESSAGES, **variables}, bounds)


def refused_within_memory(source: str, phrase: str) -> None:
    """The render stops with the size error (the phrase names which check) and its allocations
    peak at a few times the cap: the value was weighed before it was built, not built and then
    measured (memory, unlike time, does not vary with the machine's load)."""
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match=phrase):
            render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BOUNDS.max_chars, peak


DOUBLING = "{% set ns = namespace(v=SEED) %}{% for i in range(60) %}{% set ns.v = STEP %}{% endfor %}{{ ns.v|length }}"


@pytest.mark.parametrize("source, phrase", [
    ("{{ 'x' * 10**10 }}", "repetition of 10000000000 items"),
    ("{{ [0] * 10**8 }}", "repetition of 100000000 items"),
    ("{{ (7 ** 100000) % 10 }}", "power 7 \\*\\* 100000"),
    (DOUBLING.replace("SEED", "'xx'").replace("STEP", "ns.v + ns.v"), "concatenation"),
    (DOUBLING.replace("SEED", "'xx'").replace("STEP", "ns.v ~ ns.v"), "concatenation"),
    (DOUBLING.replace("SEED", "[1]").replace("STEP", "ns.v + ns.v"), "concatenation"),
    (DOUBLING.replace("SEED", "3").replace("STEP", "ns.v * ns.v"), "integer product"),
    (DOUBLING.replace("SEED", "'x'").replace("STEP", "ns.v|replace('x', 'xx')"), "replacement"),
    (DOUBLING.replace("SEED", "'x'").replace("STEP", "ns.v.replace('x', 'xx')"), "replacement"),
    ("{{ 'x'|center(10**9) }}", "width of 1000000000"),
    ("{{ 'x'.ljust(10**9) }}", "width of 1000000000"),
    ("{{ 'x'.zfill(10**9) }}", "width of 1000000000"),
    ("{{ [1]|batch(10**9, 0)|list }}", "width of 1000000000"),
    ("{{ ('a\n' * 1000)|indent(10**5) }}", "indentation"),
    ("{{ messages|tojson(indent=10**9) }}", "width of 1000000000"),
    ("{{ (['x' * 100000] * 1000)|join }}", "join"),
    ("{{ ''.join(['x' * 100000] * 1000) }}", "join"),
    ("{{ '{:>1000000000}'.format(1) }}", "too wide"),
    ("{{ '{:{}}'.format(1, 10**9) }}", "too wide"),
    ("{{ '%01000000000d' % 1 }}", "too wide"),
    ("{{ '%*d' % (10**9, 1) }}", "too wide"),
    ("{{ '%01000000000d'|format(1) }}", "too wide"),
    ("{% for i in range(99999) %}{{ 'x' * 100 }}{% endfor %}", "rendered text exceeds"),
], ids=["string repetition", "list repetition", "power", "doubling +", "doubling ~", "doubling list",
        "integer squaring", "replace filter", "replace method", "center", "ljust", "zfill", "batch", "indent",
        "tojson indent", "join filter", "join method", "format width", "format nested width", "percent width",
        "percent star", "format filter", "huge output"])
def test_a_value_past_the_cap_is_refused_before_it_is_built(source, phrase):
    refused_within_memory(source, phrase)


SHARED = "{% set ns = namespace(l='xxxxxxxx') %}{% for i in range(40) %}{% set ns.l = [ns.l] * 2 %}{% endfor %}"


@pytest.mark.parametrize("use", ["{{ ns.l }}", "{{ ns.l|tojson }}", "{{ ns.l|string }}", "{{ 'a' ~ ns.l }}",
                                 "{{ [ns.l]|join }}", "{{ [ns.l] * 1000 }}", "{{ '%s' % (ns.l,) }}",
                                 "{{ '{}'.format(ns.l) }}", "{{ '%s'|format(ns.l) }}"],
                         ids=["printed", "tojson", "string", "concatenated", "joined", "repeated", "percent",
                              "format method", "format filter"])
def test_the_text_of_a_container_of_shared_references_is_measured_before_it_is_built(use):
    """[x] * 2 nested 40 deep is 40 small lists in memory but 2**40 copies of x as text: refused
    as the literal [x] is weighed, and (where a nesting got past that) where its text is built."""
    refused_within_memory(SHARED + use, "items is too large")


CHAIN = "{% set ns = namespace(s='x' * 500000, c=none) %}{% for i in range(99999) %}{% set ns.c = LINK %}{% endfor %}"


@pytest.mark.parametrize("link", ["[ns.c, ns.s ~ i]", "{'prev': ns.c, 'value': ns.s ~ i}", "(ns.c, ns.s ~ i)",
                                  "(ns.c or []) + [ns.s ~ i]"],
                         ids=["list literal", "dict literal", "tuple literal", "list sum"])
def test_containers_that_hold_ever_more_distinct_values_stop_at_the_cap(link):
    """Each value within the cap, but a chain of them would hold memory without end."""
    refused_within_memory(CHAIN.replace("LINK", link), "items is too large")


@pytest.mark.parametrize("source", [
    "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
    "{% set s = 'x' * 100000 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}",
    "{% for a in range(99999)|list %}{% for b in range(99999)|map('string') %}{% endfor %}{% endfor %}",
    "{% macro f(n) %}{% if n > 0 %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}",
    "{% for x in [1, 2] recursive %}{{ loop(range(99999)) if loop.depth < 3 else '' }}{% endfor %}",
    "{% for m in messages %}{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}"
    "{% endfor %}",
], ids=["nested ranges", "nested string loops", "nested filtered loops", "macro fan-out", "recursive loop",
        "nested in a message loop"])
def test_a_render_that_runs_on_stops_at_its_cpu_time(source):
    with pytest.raises(RenderLimitExceeded, match="more than 0.3 s of CPU time"):
        render(source)  # without the bound these run for hours: pytest's timeout would fail the test


def test_ordinary_features_render_as_in_the_plain_sandbox():
    source = (
        "{% set ns = namespace(text='') %}"
        "{% for m in messages %}{{ loop.index }}/{{ loop.length }}{{ '!' if loop.last }}"
        "{{ m.role + ': ' + m.content ~ ';' }}{% set ns.text = ns.text + m.content %}{% endfor %}"
        "{{ ns.text }}{{ '%3d|%s' % (7, 'x') }}{{ '{:>4}'.format('y') }}{{ 'z'|center(5) }}"
        "{{ [1, 2] + [3] }}{{ 'ab' * 2 }}{{ [messages[0].role, {'c': messages[0].content}] }}{% for k, v in {'a': 1}.items() %}{{ k }}{% endfor %}{{ 2 ** 10 }}{{ 7 % 3 }}{{ messages|tojson }}"
        "{% for x in [[1, [2]], [3]] recursive %}<{% if x is iterable %}{{ loop(x) }}{% else %}{{ x }}{% endif %}>"
        "{% endfor %}{% macro twice(t) %}{{ t }}{{ t }}{% endmacro %}{{ twice('w') }}"
        "{% for i in range(1000) %}{% if i == 999 %}{{ i }}{% endif %}{% endfor %}"
    )
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = lambda value: json.dumps(value, ensure_ascii=False)
    assert render(source) == env.from_string(source).render(messages=MESSAGES)


def test_the_sandbox_still_refuses_python_internals_and_raises_template_errors():
    with pytest.raises(SecurityError):
        render("{{ ''.__class__.__mro__ }}")
    with pytest.raises(TemplateRaised, match="no tools"):
        render("{{ raise_exception('no tools') }}")


def test_each_thread_renders_under_its_own_budget():
    """A runaway render on one thread stops at its own bound; a quick render beside it is unaffected."""
    outcome = {}

    def runaway():
        try:
            render("{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}")
        except RenderLimitExceeded as error:
            outcome["runaway"] = error

    thread = threading.Thread(target=runaway)
    thread.start()
    quick = [render("{% for m in messages %}{{ m.content }}{% endfor %}") for _ in range(200)]
    thread.join(timeout=10)
    assert not thread.is_alive() and "runaway" in outcome
    assert set(quick) == {"ab"}


def test_time_spent_waiting_is_not_charged():
    """Thread CPU time, not wall time: a render that waits (for the GIL behind busy preparation
    workers; here, asleep in a callable for 0.5 s against a 0.2 s bound) is not cut short."""
    slept = []

    def nap():
        time.sleep(0.1)
        slept.append(0.1)
        return "z"

    text = render("{% for i in range(5) %}{{ nap() }}{% endfor %}", RenderBounds(max_chars=1 << 20, cpu_seconds=0.2),
                  nap=nap)
    assert text == "zzzzz" and sum(slept) > 0.2


@pytest.mark.parametrize("use", ["{{ dag }}", "{{ dag|tojson }}", "{{ 'a' ~ dag }}", "{{ dag|join }}",
                                 "{{ '%s'|format(dag) }}", "{{ dag|string }}"])
def test_the_text_of_a_shared_structure_from_anywhere_is_measured(use):
    """Whatever built it: 40 nested [x, x] lists print as 2**40 copies of x."""
    dag = "xxxxxxxx"
    for _ in range(40):
        dag = [dag, dag]
    with pytest.raises(RenderLimitExceeded, match="items is too large"):
        render(use, dag=dag)
