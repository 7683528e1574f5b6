"""Lark grammars whose compile recurses past a safe native stack depth are refused as a client's error
(`grammar_lark_depth`), while ordinary grammars of every construct are counted well below the bound.

A chain of 2,800 rules (`a0: a1`, ..., 34 kB of text, within the 64 KiB a request may send)
overflowed an 8 MiB stack inside llguidance, a segfault: the serving process's preparation threads
have a large stack and passed it, and the engine process, which compiles every admitted grammar
again on its main thread, died with the server's every later request answered 503. Here the checks
that would have passed such grammars run on a thread with the preparation pool's stack, as in the
server, so the grammars are compiled safely whether or not they are refused."""

from __future__ import annotations

import json
import threading

import pytest

from helios.frontend.structured.grammar import GrammarCompiler, GrammarError, GrammarKind, GrammarRequest
from helios.frontend.structured.grammar_lark_depth import MAX_LARK_DEPTH, lark_shape_error

from .parsers.conftest import small_bpe

STACK_NBYTES = 256 * 1024 * 1024  # the preparation pool's (helios.server.preparation)


def chain(count: int) -> str:
    return "\n".join(["start: a0", *(f"a{i}: a{i + 1}" for i in range(count)), f'a{count}: "b"'])


def cycle(count: int) -> str:
    return "\n".join(["start: a0", *(f'a{i}:"x" a{(i + 1) % count}|"y"' for i in range(count))])


def grouped_chain(count: int, groups: int) -> str:
    return "\n".join(["start: a0", *(f"a{i}: {'(' * groups}a{i + 1}{')' * groups}" for i in range(count)),
                      f'a{count}: "b"'])


def json_ref_chain(count: int) -> str:
    defs = {f"{i:x}": {"items": {"$ref": f"#/$defs/{i + 1:x}"}} for i in range(count)}
    return "start: %json " + json.dumps({"$defs": {**defs, f"{count:x}": {}}, "$ref": "#/$defs/0"})


DEEP = {
    "a 2,800-rule chain": (chain(2800), "2802 levels deep"),
    "a 3,000-rule cycle": (cycle(3000), "3001 levels deep"),
    "400 rules of 10 nested groups": (grouped_chain(400, 10), "4402 levels deep"),
    "a token chain": ("\n".join(["start: T0", *(f"T{i}: T{i + 1}" for i in range(3000)), 'T3000: "b"']), "3002 levels"),
    "a %json schema of 1,200 chained $refs": (json_ref_chain(1200), "more than 128 levels deep through its $refs"),
    # llguidance reads `a1B` as the rule a1 then the token B, as `a1 B`
    "a chain of rule-then-token references": ("\n".join(["start: a0", *(f"a{i}:a{i + 1}B" for i in range(2800)),
                                                          'a2800:"b"', 'B:"y"']), "2802 levels deep"),
    "a chain in a nested %lark grammar": ("start: %lark {\n" + chain(2800) + "\n}", "2804 levels deep"),
}
ORDINARY = {
    "JSON values": """
start: value
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
object: "{" [pair ("," pair)*] "}"
pair: STRING ":" value
array: "[" [value ("," value)*] "]"
STRING: /"[^"\\\\]*"/
NUMBER: /-?[0-9]+/
""",
    "templates, priorities, attributes and imports": """
%import common.WORD
_sep{x, sep}: x (sep x)*
start: _sep{item, ","}
item[max_tokens=8]: WORD | A
A.2: "a" | "b"
%ignore " "
""",
    "names inside strings, regexes, comments and special tokens": """
start: "a: b" /c: d\\/e/ x // f: g h i
# j: k
x: <|im_end|> | <[1-3]> "y"
""",
    "continued alternatives": 'start: a\n    | b\n    | "c"\na: "a"\nb: "b"\n',
    "nested %lark grammars": 'start: x %lark {\nstart: y\ny: "a"\n} z\nx: "q"\nz: %lark {\nstart: "w"\n}\n',
    "a 900-rule chain": chain(900),
    "a 500-rule cycle": cycle(500),
    "a %json schema": 'start: "x" %json {"type": "object", "properties": {"a": {"$ref": "#/$defs/n"}}, '
                      '"$defs": {"n": {"type": "integer"}}}',
}


@pytest.mark.parametrize("case", list(DEEP))
def test_a_grammar_past_the_depth_bound_is_refused_naming_why(case):
    grammar, words = DEEP[case]
    assert len(grammar) <= 64 * 1024  # a request may send it
    assert words in lark_shape_error(grammar)


@pytest.mark.parametrize("case", list(ORDINARY))
def test_ordinary_grammars_stay_within_the_bound(case):
    assert lark_shape_error(ORDINARY[case]) == ""


def test_the_bound_counts_levels_exactly_on_a_plain_chain():
    assert lark_shape_error(chain(MAX_LARK_DEPTH - 2)) == ""  # start, then a0 .. a998: 1000 levels
    assert f"{MAX_LARK_DEPTH + 1} levels deep" in lark_shape_error(chain(MAX_LARK_DEPTH - 1))


@pytest.fixture(scope="module")
def compiler():
    tokenizer = small_bpe(["<|endoftext|>"])
    eos = tokenizer.token_to_id("<|endoftext|>")
    return GrammarCompiler.from_tokenizer(tokenizer, vocab_size=tokenizer.get_vocab_size(), eos_token_ids=[eos])


def checked(compiler: GrammarCompiler, grammar: str) -> BaseException | None:
    """What `check` raises for the Lark grammar, run on a preparation-sized stack (None: it passed)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            compiler.check(GrammarRequest(GrammarKind.LARK, grammar))
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed back to the test
            outcome.append(error)

    previous = threading.stack_size(STACK_NBYTES)
    try:
        thread = threading.Thread(target=run)
        thread.start()
    finally:
        threading.stack_size(previous)
    thread.join()
    return outcome[0]


@pytest.mark.parametrize("case", ["a 2,800-rule chain", "a 3,000-rule cycle", "a %json schema of 1,200 chained $refs",
                                  "a chain in a nested %lark grammar"])
def test_the_compile_check_refuses_a_grammar_an_engine_process_could_not_compile(compiler, case):
    grammar, words = DEEP[case]
    error = checked(compiler, grammar)
    assert isinstance(error, GrammarError) and error.http_status == 400, error
    assert words in str(error) and str(error).startswith("invalid lark grammar: ")


def test_the_compile_check_passes_a_deep_but_safe_grammar(compiler):
    assert checked(compiler, chain(900)) is None
