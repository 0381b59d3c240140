"""Name patterns in linear time: the C++ Pattern's grammar and semantics
(sdk/src/core/pattern.h), for every pattern a user gives the Python side
(the doctor's `include`, `diff --exclude`, `inspect --exclude`).

Python's `re` backtracks: `(a|aa)*c` against a 60-character name never
answers. This matcher compiles the pattern to an automaton (Thompson's
construction) and runs it as a set of states over the name's UTF-8 bytes:
time proportional to the name's length times the pattern's size. It accepts
what the C++ side accepts (ECMAScript: literals, `.`, classes, `\\d \\w \\s`
and their negations, `^ $ \\b \\B`, groups, alternation, greedy and lazy
`* + ? {n} {n,} {n,m}`) and refuses backreferences and lookaround, with the
same reasons. tests/python/test_pattern.py holds both to the same samples."""

from typing import List, Optional, Set, Tuple

MAX_STATES = 20000
MAX_LENGTH = 4096
_MAX_NESTING = 100
_MAX_COUNT = 1000

_WORD = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
_DIGITS = frozenset(b"0123456789")
_SPACES = frozenset(b" \t\n\r\f\v")
_ALL = frozenset(range(256))

# Ops of the automaton's states.
_BYTE, _CLASS, _ANY, _SPLIT, _JUMP, _MATCH, _BEGIN, _END, _EDGE, _NOT_EDGE = range(10)


class PatternError(ValueError):
    """A pattern the matcher does not accept, naming the option, the pattern
    and what is wrong at which offset (as the C++ Pattern's Error)."""


class _Node:
    __slots__ = ("kind", "value", "kids", "min", "max")

    def __init__(self, kind, value=None, kids=None, lo=0, hi=-1):
        self.kind, self.value, self.kids, self.min, self.max = kind, value, kids or [], lo, hi


class _Parser:
    def __init__(self, pattern: bytes, option: str, ignore_case: bool, shown: str):
        self.p, self.option, self.icase, self.shown, self.i = pattern, option, ignore_case, shown, 0

    def fail(self, at, why):
        shown = self.shown if len(self.shown) <= 200 else self.shown[:200] + "..."
        raise PatternError(f"{self.option}({shown!r}) is not a pattern tensortap accepts: {why} (at offset {at})")

    def more(self):
        return self.i < len(self.p)

    def peek(self):
        return self.p[self.i]

    def alternation(self, depth):
        if depth > _MAX_NESTING:
            self.fail(self.i, f"groups nest deeper than {_MAX_NESTING}")
        kids = [self.concatenation(depth)]
        while self.more() and self.peek() == ord("|"):
            self.i += 1
            kids.append(self.concatenation(depth))
        return kids[0] if len(kids) == 1 else _Node("alt", kids=kids)

    def concatenation(self, depth):
        kids = []
        while self.more() and self.peek() not in (ord("|"), ord(")")):
            atom = self.atom(depth)
            kids.append(self.quantifiers(atom))
        return _Node("cat", kids=kids)

    def number(self):
        start, v = self.i, 0
        while self.more() and ord("0") <= self.peek() <= ord("9"):
            v = v * 10 + self.peek() - ord("0")
            if v > _MAX_COUNT:
                self.fail(start, f"a repeat count above {_MAX_COUNT}")
            self.i += 1
        return v if self.i > start else None

    def quantifiers(self, atom):
        quantified = False
        while self.more():
            at, c = self.i, chr(self.peek())
            lo, hi = 0, -1
            if c == "*":
                self.i += 1
            elif c == "+":
                lo = 1
                self.i += 1
            elif c == "?":
                hi = 1
                self.i += 1
            elif c == "{":
                self.i += 1
                n = self.number()
                if n is None:
                    self.fail(at, "'{' that does not start a repeat count {n}, {n,} or {n,m}")
                lo = hi = n
                if self.more() and self.peek() == ord(","):
                    self.i += 1
                    hi = -1
                    if self.more() and self.peek() != ord("}"):
                        m = self.number()
                        if m is None:
                            self.fail(at, "a bad repeat count")
                        hi = m
                if not self.more() or self.peek() != ord("}"):
                    self.fail(at, "a repeat count without its '}'")
                self.i += 1
                if 0 <= hi < lo:
                    self.fail(at, "a repeat count {n,m} with m < n")
            else:
                return atom
            if quantified:
                self.fail(at, "a quantifier on a quantifier")
            if atom.kind in ("begin", "end", "edge", "not_edge"):
                self.fail(at, "a quantifier on an anchor")
            if self.more() and self.peek() == ord("?"):  # lazy: the same names match
                self.i += 1
            atom = _Node("rep", kids=[atom], lo=lo, hi=hi)
            quantified = True
        return atom

    def literal(self, b):
        if self.icase and chr(b).isascii() and chr(b).isalpha():
            return _Node("class", frozenset((ord(chr(b).lower()), ord(chr(b).upper()))))
        return _Node("byte", b)

    def folded(self, s):
        out = set(s)
        for c in s:
            if chr(c).isascii() and chr(c).isalpha():
                out.update((ord(chr(c).lower()), ord(chr(c).upper())))
        return frozenset(out)

    def hex(self, digits, at):
        v = 0
        for _ in range(digits):
            if not self.more():
                self.fail(at, "a short hexadecimal escape")
            c = chr(self.peek())
            if c not in "0123456789abcdefABCDEF":
                self.fail(at, "a bad hexadecimal escape")
            v = v * 16 + int(c, 16)
            self.i += 1
        return v

    def escape(self, in_class) -> Tuple[Optional[int], Optional[frozenset]]:
        at = self.i - 1
        if not self.more():
            self.fail(at, "a '\\' at the end")
        c = chr(self.peek())
        self.i += 1
        sets = {"d": _DIGITS, "D": _ALL - _DIGITS, "w": _WORD, "W": _ALL - _WORD, "s": _SPACES, "S": _ALL - _SPACES}
        if c in sets:
            return None, sets[c]
        simple = {"n": 10, "r": 13, "t": 9, "f": 12, "v": 11, "0": 0}
        if c in simple:
            return simple[c], None
        if c == "b" and in_class:
            return 8, None
        if c == "x":
            return self.hex(2, at), None
        if c == "u":
            v = self.hex(4, at)
            if v > 0xFF:
                self.fail(at, "a \\u escape above \\u00FF (names are matched byte by byte)")
            return v, None
        if c == "c":
            if self.more() and chr(self.peek()).isascii() and chr(self.peek()).isalpha():
                self.i += 1
                return self.p[self.i - 1] % 32, None
            self.fail(at, "a bad \\c escape")
        if "1" <= c <= "9":
            self.fail(at, "a backreference (it needs a backtracking matcher)")
        if ord(c) in _WORD:
            self.fail(at, f"an unknown escape '\\{c}'")
        return ord(c), None

    def bracket(self):
        at = self.i - 1
        members: Set[int] = set()
        negate = False
        if self.more() and self.peek() == ord("^"):
            negate = True
            self.i += 1
        while True:
            if not self.more():
                self.fail(at, "a '[' without its ']'")
            if self.peek() == ord("]"):
                self.i += 1
                break
            if self.peek() == ord("\\"):
                self.i += 1
                lo, part = self.escape(True)
            else:
                lo, part = self.p[self.i], None
                self.i += 1
            if lo is None:
                members |= part or frozenset()
                continue
            hi: Optional[int] = lo
            if self.i + 1 < len(self.p) and self.peek() == ord("-") and self.p[self.i + 1] != ord("]"):
                dash = self.i
                self.i += 1
                if self.peek() == ord("\\"):
                    self.i += 1
                    hi, part = self.escape(True)
                    if hi is None:
                        self.fail(dash, "a range that ends in a class escape")
                else:
                    hi = self.p[self.i]
                    self.i += 1
                assert hi is not None
                if hi < lo:
                    self.fail(dash, "a range out of order")
            assert hi is not None
            members.update(range(lo, hi + 1))
        s = self.folded(members) if self.icase else frozenset(members)
        return _Node("class", _ALL - s if negate else s)

    def atom(self, depth):
        at, c = self.i, chr(self.p[self.i])
        self.i += 1
        if c == "^":
            return _Node("begin")
        if c == "$":
            return _Node("end")
        if c == ".":
            return _Node("any")
        if c == "[":
            return self.bracket()
        if c in "*+?":
            self.fail(at, "a quantifier with nothing to repeat")
        if c == "{":
            save = self.i
            if self.number() is not None:
                self.fail(at, "a quantifier with nothing to repeat")
            self.i = save
            return self.literal(ord("{"))
        if c == "(":
            if self.more() and self.peek() == ord("?"):
                if self.i + 1 < len(self.p) and self.p[self.i + 1] == ord(":"):
                    self.i += 2
                else:
                    self.fail(at, "lookaround or a named group (it needs a backtracking matcher)")
            inner = self.alternation(depth + 1)
            if not self.more() or self.peek() != ord(")"):
                self.fail(at, "a '(' without its ')'")
            self.i += 1
            return inner
        if c == "\\":
            if self.more() and self.peek() in (ord("b"), ord("B")):
                edge = self.peek() == ord("b")
                self.i += 1
                return _Node("edge" if edge else "not_edge")
            b, s = self.escape(False)
            return _Node("class", s) if b is None else self.literal(b)
        return self.literal(self.p[at])


class Pattern:
    """A compiled name pattern: `search(name)` says whether it matches anywhere
    in `name` (as re.search / std::regex_search), in linear time. The empty
    pattern matches every name. `option` names the setting in errors."""

    def __init__(self, pattern: str, option: str = "pattern", ignore_case: bool = False):
        self.pattern = pattern
        self._program: List[list] = []
        if not pattern:
            return
        raw = pattern.encode("utf-8", "surrogateescape")
        parser = _Parser(raw, option, ignore_case, pattern)
        if len(raw) > MAX_LENGTH:
            parser.fail(0, f"the pattern is {len(raw)} bytes long; at most {MAX_LENGTH} are accepted")
        root = parser.alternation(0)
        if parser.more():
            parser.fail(parser.i, "unmatched ')'")
        self._parser = parser
        self._compile(root)
        self._emit([_MATCH])
        del self._parser

    def _emit(self, state):
        if len(self._program) >= MAX_STATES:
            self._parser.fail(0, f"its automaton would have more than {MAX_STATES} states")
        self._program.append(state)
        return len(self._program) - 1

    def _compile(self, n):
        ops = {"any": _ANY, "begin": _BEGIN, "end": _END, "edge": _EDGE, "not_edge": _NOT_EDGE}
        if n.kind == "byte":
            self._emit([_BYTE, n.value])
        elif n.kind == "class":
            self._emit([_CLASS, n.value])
        elif n.kind in ops:
            self._emit([ops[n.kind]])
        elif n.kind == "cat":
            for k in n.kids:
                self._compile(k)
        elif n.kind == "alt":
            jumps = []
            for k, kid in enumerate(n.kids):
                if k + 1 < len(n.kids):
                    split = self._emit([_SPLIT, len(self._program) + 1, 0])
                    self._compile(kid)
                    jumps.append(self._emit([_JUMP, 0]))
                    self._program[split][2] = len(self._program)
                else:
                    self._compile(kid)
            for j in jumps:
                self._program[j][1] = len(self._program)
        else:  # rep
            body = n.kids[0]
            for _ in range(n.min):
                self._compile(body)
            if n.max < 0:
                loop = self._emit([_SPLIT, len(self._program) + 1, 0])
                self._compile(body)
                self._emit([_JUMP, loop])
                self._program[loop][2] = len(self._program)
                return
            splits = []
            for _ in range(n.min, n.max):
                splits.append(self._emit([_SPLIT, len(self._program) + 1, 0]))
                self._compile(body)
            for s in splits:
                self._program[s][2] = len(self._program)

    def search(self, name: str) -> bool:
        """Whether the pattern matches anywhere in `name` (its UTF-8 bytes)."""
        prog = self._program
        if not prog:
            return True
        s = name.encode("utf-8", "surrogateescape")
        n = len(s)

        def closure(starts, pos, out, seen):
            # Every state reachable from `starts` without reading a byte at
            # `pos`; True when that reaches the match.
            stack = list(starts)
            while stack:
                pc = stack.pop()
                if pc in seen:
                    continue
                seen.add(pc)
                st = prog[pc]
                op = st[0]
                if op == _MATCH:
                    return True
                if op == _JUMP:
                    stack.append(st[1])
                elif op == _SPLIT:
                    stack.append(st[2])
                    stack.append(st[1])
                elif op == _BEGIN:
                    if pos == 0:
                        stack.append(pc + 1)
                elif op == _END:
                    if pos == n:
                        stack.append(pc + 1)
                elif op in (_EDGE, _NOT_EDGE):
                    before = pos > 0 and s[pos - 1] in _WORD
                    after = pos < n and s[pos] in _WORD
                    if (before != after) == (op == _EDGE):
                        stack.append(pc + 1)
                else:
                    out.append(pc)
            return False

        current: List[int] = []
        seen: Set[int] = set()
        for pos in range(n + 1):
            # A search: a match may also start here.
            if closure([0], pos, current, seen):
                return True
            if pos == n:
                return False
            c = s[pos]
            nxt: List[int] = []
            nseen: Set[int] = set()
            for pc in current:
                st = prog[pc]
                op = st[0]
                takes = (st[1] == c if op == _BYTE else c in st[1] if op == _CLASS
                         else c not in (10, 13) if op == _ANY else False)
                if takes and closure([pc + 1], pos + 1, nxt, nseen):
                    return True
            current, seen = nxt, nseen
        return False
