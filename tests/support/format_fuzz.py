"""Random constrained-output formats (regex, choice, Lark grammar) and independent judges for them.

Regexes are built as small syntax trees (`random_regex`) and written in the dialect llguidance and
the `regex` package read alike: escaped literals (punctuation, ``\\xhh``, ``\\uhhhh``, ``\\Uhhhhhhhh``),
classes and negated classes (their special characters always escaped, so no set operation or nested
class is ever spelled), ``\\d \\D \\s \\S \\w``, ``.``, alternation, capturing and non-capturing
groups, ``? * + {m} {m,n} {m,}`` (sometimes lazy), and ``^``/``$`` at the ends. ``\\W`` and ``\\w``
inside a negated class are left out: llguidance's Unicode tables are older than the `regex`
package's, so a character assigned since then is ``\\w`` to the judge only (the other direction
never differs). `language` enumerates a tree's strings when they are few.

Grammars (`random_grammar`) are small context-free grammars written in llguidance's Lark dialect:
rules with alternation, ``? * +`` repetition, groups and recursion (every rule has a base
alternative that only uses rules before it, so every rule derives a string), over terminals that
lex one way only (literals with pairwise distinct first characters, and one-character classes on
characters no literal starts with), so the lexer-based parser's language is the grammar's.
`Cfg.accepts` is an Earley recognizer over the characters; `Cfg.language` enumerates its short strings.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

# -- regexes ------------------------------------------------------------------------------------------

LITERALS = "abz07 _,:=%!@;`" + '.^$*+?()[]{}|/-"\'#~&' + "é中ж😀\t\n"
META = set('.^$*+?()[]{}|/-"\'#~&\\')
CLASS_META = set("[]\\^-&~|")
RANGES = [("a", "f"), ("0", "9"), ("x", "z"), ("à", "ö"), ("α", "ω"), ("一", "七")]


@dataclass(frozen=True)
class Lit:
    char: str
    spelling: str

    def text(self) -> str:
        return self.spelling


@dataclass(frozen=True)
class Cls:
    chars: tuple[str, ...]  # single characters
    ranges: tuple[tuple[str, str], ...]
    escapes: tuple[str, ...]  # "d", "s", "w"
    negated: bool = False

    def text(self) -> str:
        parts = [f"\\{c}" if c in CLASS_META else c for c in self.chars]
        parts += [f"{lo}-{hi}" for lo, hi in self.ranges]
        parts += [f"\\{e}" for e in self.escapes]
        return "[" + ("^" if self.negated else "") + "".join(parts) + "]"

    @property
    def is_finite(self) -> bool:
        return not self.negated and not self.escapes


@dataclass(frozen=True)
class Esc:
    letter: str  # d D s S w, or "." for any character but a newline

    def text(self) -> str:
        return "." if self.letter == "." else f"\\{self.letter}"


@dataclass(frozen=True)
class Seq:
    parts: tuple

    def text(self) -> str:
        return "".join(part.text() for part in self.parts)


@dataclass(frozen=True)
class Alt:
    options: tuple

    def text(self) -> str:
        return "|".join(option.text() for option in self.options)


@dataclass(frozen=True)
class Group:
    inner: object
    capturing: bool

    def text(self) -> str:
        return ("(" if self.capturing else "(?:") + self.inner.text() + ")"


@dataclass(frozen=True)
class Rep:
    inner: object  # an atom or a group
    low: int
    high: int | None  # None: unbounded
    lazy: bool = False

    def text(self) -> str:
        if (self.low, self.high) == (0, 1):
            suffix = "?"
        elif (self.low, self.high) == (0, None):
            suffix = "*"
        elif (self.low, self.high) == (1, None):
            suffix = "+"
        elif self.high is None:
            suffix = f"{{{self.low},}}"
        elif self.low == self.high:
            suffix = f"{{{self.low}}}"
        else:
            suffix = f"{{{self.low},{self.high}}}"
        return self.inner.text() + suffix + ("?" if self.lazy else "")


@dataclass(frozen=True)
class Regex:
    tree: object
    start_anchor: bool = False
    end_anchor: bool = False

    @property
    def pattern(self) -> str:
        return ("^" if self.start_anchor else "") + self.tree.text() + ("$" if self.end_anchor else "")


def spell_literal(rng: random.Random, char: str) -> str:
    roll = rng.random()
    if roll < 0.15:
        return f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}" if ord(char) < 0x10000 \
            else f"\\U{ord(char):08x}"
    if roll < 0.2 and ord(char) < 0x10000:
        return f"\\u{ord(char):04X}"
    if char in META:
        return "\\" + char
    if char == "\n":
        return "\\n" if roll < 0.6 else char
    if char == "\t":
        return "\\t" if roll < 0.6 else char
    return char


def _literal(rng: random.Random) -> Lit:
    char = rng.choice(LITERALS)
    return Lit(char, spell_literal(rng, char))


def _class(rng: random.Random, finite: bool) -> Cls:
    negated = not finite and rng.random() < 0.3
    chars = tuple(rng.sample(LITERALS, rng.randint(0 if not finite else 1, 3)))
    ranges = tuple(rng.sample(RANGES, rng.randint(0, 1)))
    escapes = () if finite else tuple(rng.sample(["d", "s"] if negated else ["d", "s", "w"], rng.randint(0, 1)))
    if not (chars or ranges or escapes):
        chars = (rng.choice(LITERALS),)
    return Cls(chars, ranges, escapes, negated)


def _atom(rng: random.Random, depth: int, finite: bool):
    roll = rng.random()
    if depth < 2 and roll < 0.2:
        return Group(_alternation(rng, depth + 1, finite), rng.random() < 0.5)
    if roll < 0.6:
        return _literal(rng)
    if roll < 0.8 or finite:
        return _class(rng, finite)
    return Esc(rng.choice("dDsSw."))


def _quantified(rng: random.Random, depth: int, finite: bool):
    atom = _atom(rng, depth, finite)
    roll = rng.random()
    if roll < 0.6:
        return atom
    bounded = [(0, 1), (2, 2), (1, 2), (0, 3)]
    unbounded = [(0, None), (1, None), (2, None)]
    # A group repeats a bounded number of times: (?:x{0,3}){2,} backtracks exponentially in the judge.
    low, high = rng.choice(bounded if finite or isinstance(atom, Group) or rng.random() < 0.5 else unbounded)
    return Rep(atom, low, high, lazy=rng.random() < 0.15)


def _sequence(rng: random.Random, depth: int, finite: bool) -> Seq:
    return Seq(tuple(_quantified(rng, depth, finite) for _ in range(rng.randint(1, 4 if depth == 0 else 2))))


def _alternation(rng: random.Random, depth: int, finite: bool):
    count = 1 if rng.random() < 0.6 else rng.randint(2, 3)
    options = tuple(_sequence(rng, depth, finite) for _ in range(count))
    return options[0] if count == 1 else Alt(options)


def random_regex(rng: random.Random, finite: bool = False) -> Regex:
    """A random regex; with `finite`, one whose language `language` can enumerate (no classes
    escapes, negations, dots or unbounded repetition)."""
    tree = _alternation(rng, 0, finite)
    anchored = not isinstance(tree, Alt)  # ^a|b$ anchors one branch each: keep the ends simple
    return Regex(tree, anchored and rng.random() < 0.2, anchored and rng.random() < 0.2)


def language(node, cap: int = 64) -> frozenset[str] | None:
    """Every string `node` matches, or None when they are more than `cap` (or unbounded)."""
    if isinstance(node, Regex):
        return language(node.tree, cap)
    if isinstance(node, Lit):
        return frozenset([node.char])
    if isinstance(node, Cls):
        if not node.is_finite:
            return None
        chars = set(node.chars)
        for lo, hi in node.ranges:
            chars |= {chr(c) for c in range(ord(lo), ord(hi) + 1)}
        return frozenset(chars) if len(chars) <= cap else None
    if isinstance(node, Esc):
        return None
    if isinstance(node, Group):
        return language(node.inner, cap)
    if isinstance(node, Alt):
        out: set[str] = set()
        for option in node.options:
            part = language(option, cap)
            if part is None:
                return None
            out |= part
        return frozenset(out) if len(out) <= cap else None
    if isinstance(node, Seq):
        return _concatenation([language(part, cap) for part in node.parts], cap)
    if isinstance(node, Rep):
        if node.high is None:
            return None
        inner = language(node.inner, cap)
        if inner is None:
            return None
        out = set()
        for count in range(node.low, node.high + 1):
            part = _concatenation([inner] * count, cap)
            if part is None:
                return None
            out |= part
        return frozenset(out) if len(out) <= cap else None
    raise TypeError(node)


def _concatenation(parts, cap: int) -> frozenset[str] | None:
    out = {""}
    for part in parts:
        if part is None:
            return None
        out = {left + right for left in out for right in part}
        if len(out) > cap:
            return None
    return frozenset(out)


def mutations(rng: random.Random, text: str, count: int) -> list[str]:
    """Strings near `text`: a character inserted, deleted or replaced."""
    out = []
    for _ in range(count):
        where = rng.randint(0, len(text))
        kind = rng.random()
        if kind < 0.4 or not text:
            out.append(text[:where] + rng.choice(LITERALS) + text[where:])
        elif kind < 0.7:
            where = min(where, len(text) - 1)
            out.append(text[:where] + text[where + 1:])
        else:
            where = min(where, len(text) - 1)
            out.append(text[:where] + rng.choice(LITERALS) + text[where + 1:])
    return out


# -- choices ------------------------------------------------------------------------------------------

CHOICE_WORDS = ["yes", "no", "maybe", "y", "ye", "yes!", "a b", " lead", "trail ", "tab\there", "line\nbreak",
                "\u00e9t\u00e9", "\u4e2d\u6587", "\U0001F600", '"quoted"', "back\\slash", "a.*b", "(x|y)",
                "[0-9]+", "{}", "$^", "/slash/", "null", "\u2028", "x", "xx", "xxx"]


def random_choices(rng: random.Random) -> list[str]:
    """A choice list: shared prefixes, one choice a prefix of another, unicode, whitespace,
    regex/JSON specials, duplicates; sometimes one choice, sometimes 256."""
    roll = rng.random()
    if roll < 0.1:
        return [rng.choice(CHOICE_WORDS)]
    if roll < 0.2:
        stems = [rng.choice(CHOICE_WORDS) for _ in range(4)]
        return [f"{rng.choice(stems)}{index}" for index in range(256)]
    choices = rng.sample(CHOICE_WORDS, rng.randint(2, 6))
    if rng.random() < 0.5:
        base = rng.choice(choices)
        choices.append(base + rng.choice(["", "s", " ", "\u00e9", "!"]))  # a duplicate or an extension
    rng.shuffle(choices)
    return choices


# -- context-free grammars ----------------------------------------------------------------------------


@dataclass
class Cfg:
    """A BNF grammar over characters: nonterminals are str names, terminals are frozensets of
    characters (one character each). `rules[name]` lists the alternatives (tuples of symbols)."""

    rules: dict[str, list[tuple]] = field(default_factory=dict)
    start: str = "start"

    def fresh(self, prefix: str) -> str:
        name = f"{prefix}_{len(self.rules)}"
        self.rules[name] = []
        return name

    def accepts(self, text: str) -> bool:
        """Earley recognition of `text` (nullable rules handled by Aycock-Horspool completion)."""
        nullable = self._nullable()
        chart = [set() for _ in range(len(text) + 1)]
        for alternative in self.rules[self.start]:
            chart[0].add((self.start, alternative, 0, 0))
        for position in range(len(text) + 1):
            agenda = list(chart[position])
            while agenda:
                name, alternative, dot, origin = agenda.pop()
                if dot < len(alternative):
                    symbol = alternative[dot]
                    if isinstance(symbol, str):
                        for production in self.rules[symbol]:
                            item = (symbol, production, 0, position)
                            if item not in chart[position]:
                                chart[position].add(item)
                                agenda.append(item)
                        if symbol in nullable:
                            item = (name, alternative, dot + 1, origin)
                            if item not in chart[position]:
                                chart[position].add(item)
                                agenda.append(item)
                    elif position < len(text) and text[position] in symbol:
                        chart[position + 1].add((name, alternative, dot + 1, origin))
                else:
                    for parent, parent_alt, parent_dot, parent_origin in list(chart[origin]):
                        if parent_dot < len(parent_alt) and parent_alt[parent_dot] == name:
                            item = (parent, parent_alt, parent_dot + 1, parent_origin)
                            if item not in chart[position]:
                                chart[position].add(item)
                                agenda.append(item)
        return any(name == self.start and dot == len(alternative) and origin == 0
                   for name, alternative, dot, origin in chart[len(text)])

    def _nullable(self) -> set[str]:
        nullable: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.rules.items():
                if name not in nullable and any(all(isinstance(s, str) and s in nullable for s in alt)
                                                for alt in alternatives):
                    nullable.add(name)
                    changed = True
        return nullable

    def language(self, max_len: int, cap: int = 200) -> frozenset[str] | None:
        """Every string of at most `max_len` characters the grammar derives (a fixpoint over each
        rule's short strings: a short string derives from short strings only), or None when a rule
        has more than `cap` of them."""
        table: dict[str, set[str]] = {name: set() for name in self.rules}
        changed = True
        while changed:
            changed = False
            for name, alternatives in self.rules.items():
                for alternative in alternatives:
                    for text in self._expand(alternative, table, max_len):
                        if text not in table[name]:
                            table[name].add(text)
                            changed = True
                            if len(table[name]) > cap:
                                return None
        return frozenset(table[self.start])

    @staticmethod
    def _expand(alternative: tuple, table: dict[str, set[str]], limit: int) -> set[str]:
        texts = {""}
        for symbol in alternative:
            pool = table[symbol] if isinstance(symbol, str) else symbol
            texts = {text + part for text in texts for part in pool if len(text) + len(part) <= limit}
        return texts


@dataclass(frozen=True)
class RandomGrammar:
    lark: str
    cfg: Cfg


class GrammarWriter:
    """Writes one random Lark grammar and the matching character-level `Cfg`."""

    LITERAL_POOL = ["a", "bc", "dd", "\u00e9", "\u4e2d\u6587", "\n", " ", "\"", "\\", "+", "(", "xyz", "0"]
    CLASS_POOL = [("[p-r]", "pqr"), ("[5-7]", "567"), ("[%&]", "%&")]

    def __init__(self, rng: random.Random, num_rules: int):
        self.rng = rng
        self.cfg = Cfg()
        self.num_rules = num_rules
        literals = rng.sample(self.LITERAL_POOL, 5)
        self.literals = list({lit[0]: lit for lit in literals}.values())  # distinct first characters
        self.classes = rng.sample(self.CLASS_POOL, 2)

    def write(self) -> RandomGrammar:
        names = ["start"] + [f"r{index}" for index in range(1, self.num_rules)]
        for name in names:
            self.cfg.rules[name] = []
        lines = []
        # The base alternative of rule i uses rules after it only (all rules derive a string: the
        # last one's base holds terminals only); other alternatives may refer to any rule.
        for index, name in enumerate(names):
            later = names[index + 1:]
            alternatives = [self._alternative(later, depth=0)]
            for _ in range(self.rng.randint(0, 2)):
                alternatives.append(self._alternative(names, depth=0))
            texts = []
            for text, symbols in alternatives:
                texts.append(text)
                self.cfg.rules[name].append(symbols)
            lines.append(f"{name}: " + " | ".join(texts))
        return RandomGrammar("\n".join(lines) + "\n", self.cfg)

    def _alternative(self, rules: list[str], depth: int) -> tuple[str, tuple]:
        items = [self._item(rules, depth) for _ in range(self.rng.randint(1, 3))]
        return " ".join(text for text, _ in items), tuple(symbol for _, symbol in items)

    def _item(self, rules: list[str], depth: int) -> tuple[str, object]:
        text, symbol = self._atom(rules, depth)
        roll = self.rng.random()
        if roll < 0.7:
            return text, symbol
        name = self.cfg.fresh("rep")
        if roll < 0.8:  # x?
            self.cfg.rules[name] = [(), (symbol,)]
            return f"{text}?", name
        if roll < 0.9:  # x*
            self.cfg.rules[name] = [(), (name, symbol)]
            return f"{text}*", name
        self.cfg.rules[name] = [(symbol,), (name, symbol)]  # x+
        return f"{text}+", name

    def _atom(self, rules: list[str], depth: int) -> tuple[str, object]:
        roll = self.rng.random()
        if rules and roll < 0.3:
            return (name := self.rng.choice(rules)), name
        if depth < 1 and roll < 0.45:
            options = [self._alternative(rules, depth + 1) for _ in range(self.rng.randint(2, 3))]
            name = self.cfg.fresh("group")
            self.cfg.rules[name] = [symbols for _, symbols in options]
            return "(" + " | ".join(text for text, _ in options) + ")", name
        if roll < 0.85:
            literal = self.rng.choice(self.literals)
            if len(literal) == 1:
                return json.dumps(literal, ensure_ascii=self.rng.random() < 0.5), frozenset(literal)
            name = self.cfg.fresh("lit")
            self.cfg.rules[name] = [tuple(frozenset(c) for c in literal)]
            return json.dumps(literal, ensure_ascii=self.rng.random() < 0.5), name
        pattern, chars = self.rng.choice(self.classes)
        return f"/{pattern}/", frozenset(chars)


def random_grammar(rng: random.Random, num_rules: int | None = None) -> RandomGrammar:
    return GrammarWriter(rng, num_rules or rng.randint(1, 4)).write()
