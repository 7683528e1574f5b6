"""jinja's `lipsum` global and `wordwrap`, `urlize` and `sum` filters in the bounded sandbox (session 68): one call
built its whole value, past the size cap (and the CPU bound), since a single call counts a single
step."""

from __future__ import annotations

import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from helios.core.template_sandbox import BoundedSandbox, RenderBounds, RenderLimitExceeded, render_bounded

BOUNDS = RenderBounds(max_chars=1 << 20, cpu_seconds=0.3)


def render(source: str) -> str:
    return render_bounded(BoundedSandbox().from_string(source), {}, BOUNDS)


@pytest.mark.parametrize("source", [
    "{% set x = lipsum(20000) %}ok",  # 9 MB built, none of it printed
    "{% set x = lipsum(200, False, 20000, 20001) %}{{ x|length }}",  # 30 MB and seconds of CPU in one call
    "{{ lipsum(1, min=10**5, max=10**5+1) }}",
    "{% set x = lipsum(2000000, True, -1, 0) %}ok",  # max <= 0 still builds a paragraph each: 18 MB, seconds
])
def test_lipsum_past_the_cap_is_refused_before_it_is_built(source):
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match="lorem ipsum"):
            render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BOUNDS.max_chars, peak


def test_lipsum_within_the_cap_renders_as_jinja_has_it():
    assert render("{{ lipsum(2, html=False)|wordcount > 0 }}") == "True"
    assert render("{{ lipsum(-1) }}") == ""
    assert "<p>" in render("{{ lipsum(1) }}")


@pytest.mark.parametrize("source", [
    "{% set x = ('a ' * 1000)|wordwrap(1, wrapstring='x' * 100000) %}ok",  # 100 MB in one call
    "{% set x = ('a ' * 1000)|wordwrap(width=1, wrapstring='x' * 100000) %}ok",
    "{% set x = ('a' ~ '\n') * 400000 %}{{ x|wordwrap(79, True, '<br>')|length }}",
])
def test_wordwrap_past_the_cap_is_refused_before_it_is_built(source):
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match="word wrap"):
            render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BOUNDS.max_chars, peak


def test_wordwrap_within_the_cap_renders_as_jinja_has_it():
    assert render("{{ 'hello world foo'|wordwrap(5) }}") == "hello\nworld\nfoo"
    assert render("{{ 'hello world foo'|wordwrap(5, wrapstring='|') }}") == "hello|world|foo"
    long = "{{ ('word ' * 150000)|wordwrap(79, True, '<br>') }}"  # 750 KB, under the 1 MiB cap
    assert render(long) == ImmutableSandboxedEnvironment().from_string(long).render()


@pytest.mark.parametrize("source", [
    "{% set x = ('http://a.com ' * 1000)|urlize(target='x' * 10000) %}ok",  # 10 MB in one call
    "{% set x = ('www.a.com ' * 1000)|urlize(rel='x' * 10000) %}ok",
    "{% set x = ('www.a.com ' * 1000)|urlize(20, True, 'x' * 10000) %}ok",
])
def test_urlize_past_the_cap_is_refused_before_it_is_built(source):
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match="urlize"):
            render(source)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BOUNDS.max_chars, peak


def test_urlize_of_a_text_past_its_bound_is_refused_before_it_runs():
    """Without target or rel urlize builds about what it reads, but runs its regexes on every word in
    one call (one step): a text of the size cap's length took seconds past the CPU bound."""
    with pytest.raises(RenderLimitExceeded, match="urlize of"):
        render_bounded(BoundedSandbox().from_string("{% set x = ('a.b ' * 300000)|urlize %}ok"), {},
                       RenderBounds(max_chars=1 << 24, cpu_seconds=30))


def test_urlize_within_the_cap_renders_as_jinja_has_it():
    for source in ("{{ 'see http://a.com now'|urlize(target='_blank') }}", "{{ 'mail a@b.org'|urlize(rel='me') }}",
                   "{{ ('Hello there. ' * 20000)|urlize(target='_blank') }}"):
        assert render(source) == ImmutableSandboxedEnvironment().from_string(source).render()


def test_a_sum_of_lists_past_the_cap_is_refused_before_it_is_built():
    """`sum` added the lists pairwise: 300 lists of 10,000 items took 14 s of CPU in one call (the
    time bound is checked between steps) and built 3,000,000 items."""
    tracemalloc.start()
    try:
        with pytest.raises(RenderLimitExceeded, match="a sum of 3000000 items"):
            render("{% set x = ['a'] * 10000 %}{% set y = [x] * 300 %}{{ y|sum(start=[])|length }}")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 * BOUNDS.max_chars, peak


@pytest.mark.parametrize("source", [
    "{{ [1, 2, 3]|sum }}", "{{ [1.5, 2]|sum(start=1) }}", "{{ [{'p': 2}, {'p': 3}]|sum(attribute='p') }}",
    "{{ [[1], [2]]|sum(start=[]) }}", "{{ [(1,), (2,)]|sum(start=()) }}", "{{ []|sum }}", "{{ range(5)|sum }}",
    "{% set x = ['a'] * 1000 %}{% set y = [x] * 300 %}{{ y|sum(start=[])|length }}",
])
def test_a_sum_within_the_cap_renders_as_jinja_has_it(source):
    assert render(source) == ImmutableSandboxedEnvironment().from_string(source).render()


@pytest.mark.parametrize("source", ["{{ [[1], (2,)]|sum(start=[]) }}", "{{ [[1], [2]]|sum }}",
                                    "{{ ['a', 'b']|sum(start='') }}"])
def test_a_sum_of_mixed_kinds_raises_type_error_as_jinja_does(source):
    with pytest.raises(TypeError):
        ImmutableSandboxedEnvironment().from_string(source).render()
    with pytest.raises(TypeError):
        render(source)
