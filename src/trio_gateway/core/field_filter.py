"""Split-safe filtering of one field's text (a stream's content, its reasoning, one tool call's
arguments), masked or blocked as it passes, whatever the cuts between its pieces. Pure;
``core/filter_match.py`` finds the matches, ``core/normalize.py`` gives the form they are found
in, ``core/filters.py`` runs a stream's fields.

**What the client gets** (the reference, :func:`mask_whole` on the whole text): the text is
normalized (NFKC, default-ignorable code points removed) and every occurrence of every pattern
and every regex match (RE2's leftmost-first, per regex, one after another) is found in the
normalized text, overlapping ones included. Each occurrence stands for the span of original text
its normalized characters came from (whole normalization segments: the ligature ``fi`` whose ``i``
matched, the zero-width spaces inside a match). Taken by start (a ``block`` first, then the
longest, then the filter listed first), each occurrence that starts outside the characters already
masked replaces its span with its filter's mask, and the characters it covers are gone; one that
starts inside them only extends them (overlapping occurrences make one mask). The first ``block``
occurrence ends the text at its start: what comes before it is said, masked as above, and nothing
of it or after it. So a mask replaces exactly the original text of the match, whatever spelling
it had, and the rest is said as written.

**Streaming** (:class:`FieldFilter`): text is said as soon as no occurrence not yet seen could
cover it. An occurrence not yet complete starts in the normalized text's last ``hold``
characters (the automaton's longest suffix that may still grow into a match), or, for a regex,
at a start not yet decided (less than its reach before the end); and the last normalization
segment may still grow. So at most the longest possible match minus one normalized character is
held back (:attr:`Matcher.window`), plus the open segment, and an occurrence is masked before any
of its characters is said. Literal-only filters hold back nothing while the text cannot begin a
match (but a letter an accent could still join); a regex holds back its reach.

**Flush** (:meth:`FieldFilter.flush`): a field that another field interrupts says what it holds,
as if it ended there (a stream's parts keep their order, ``core/filters.py``). Should it go on,
its matching goes on where it was: an occurrence that began in the text already said is masked
from where that text ends, and a block still ends the answer.

Every split of a text into pieces gives the same output as the whole (property-tested in
``tests/unit/test_filters_property.py``). Text reaches this module as ``str``: the SSE decoder
(``core/sse.py``) cuts the byte stream only at line ends, so a multi-byte UTF-8 character is never
seen in halves.
"""

from __future__ import annotations

from trio_gateway.core.filter_match import Matcher, Rule, fold
from trio_gateway.core.normalize import Normalizer

# (start, 0 for a block else 1, -length, rule, end), in original offsets: sorted, the order the
# reference takes them.
_Occurrence = tuple[int, int, int, int, int]


class FieldFilter:
    """One field of one stream. Offsets are in the original text unless named normalized."""

    __slots__ = (
        "_base",
        "_buf",
        "_emit",
        "_exact_state",
        "_folded_state",
        "_hold_from",
        "_known",
        "_mask_until",
        "_matched",
        "_matcher",
        "_nbase",
        "_nbuf",
        "_nn",
        "_normalizer",
        "_q",
        "blocked",
    )

    def __init__(self, matcher: Matcher, matched: list[Rule] | None = None) -> None:
        self._matcher = matcher
        self._normalizer = Normalizer()
        self._buf = ""  # the original text from _base: what is still to be said
        self._base = 0
        self._emit = 0  # characters decided (said, masked or dropped)
        self._mask_until = 0  # the characters before this are under a mask already said
        self._nn = 0  # normalized characters so far
        self._nbuf = ""  # the normalized text from _nbase (what the regexes still read)
        self._nbase = 0
        self._folded_state = 0
        self._exact_state = 0
        self._hold_from = 0  # normalized: the automata's held suffix starts here
        self._q = [0] * len(matcher.regexes)  # each regex: normalized starts before are decided
        self._known: list[_Occurrence] = []
        self._matched = matched if matched is not None else []
        self.blocked: Rule | None = None

    @property
    def held(self) -> int:
        """Characters fed and not yet decided."""
        return self._normalizer.fed - self._emit

    @property
    def fed(self) -> int:
        return self._normalizer.fed

    def feed(self, text: str) -> str:
        """The part of the text, masked, that can be said now. After a block, nothing more."""
        if self.blocked is not None or not text:
            return ""
        # The step of every chunk of a filtered stream: written out, not shared with close().
        self._buf += text
        normalizer = self._normalizer
        normal = normalizer.feed(text)
        matcher = self._matcher
        nn = self._nn
        if normal:
            offset = nn
            nn = self._nn = offset + len(normal)
            hold = 0
            automaton = matcher.folded
            if automaton is not None:
                found: list[tuple[int, int, int]] = []
                state = automaton.scan(self._folded_state, fold(normal), offset, found)
                self._folded_state = state
                hold = automaton.hold[state]
                if found:
                    self._add(found, matcher.folded_rule)
            automaton = matcher.exact
            if automaton is not None:
                found = []
                state = self._exact_state = automaton.scan(self._exact_state, normal, offset, found)
                hold = max(hold, automaton.hold[state])
                if found:
                    self._add(found, matcher.exact_rule)
            first = self._hold_from = nn - hold
            if matcher.regexes:
                self._nbuf += normal
        else:
            first = self._hold_from
        if matcher.regexes:
            first = min(first, self._regexes(final=False))
        cut = normalizer.stable
        if first < nn:
            cut = min(cut, normalizer.map.start(first))
        said = self._render(cut)
        self._trim(first)
        return said

    def close(self) -> str:
        """The end of the field's text: the rest, masked."""
        if self.blocked is not None:
            return ""
        return self._advance(self._normalizer.flush(), final=True)

    def flush(self) -> str:
        """The rest, masked, as if the text ended here; more may follow (see the module)."""
        if self.blocked is not None:
            return ""
        normal = self._normalizer.flush()
        # The regexes read on from where they were sure: text still to come may make a match
        # of a start the end of the text decided.
        return self._advance(normal, final=True, resume=list(self._q))

    def _advance(self, normal: str, *, final: bool, resume: list[int] | None = None) -> str:
        """Matches the normalized text ``normal`` that just came, then says what it can."""
        matcher = self._matcher
        offset = self._nn
        nn = self._nn = offset + len(normal)
        if normal:
            hold = 0
            found: list[tuple[int, int, int]] = []
            if matcher.folded is not None:
                automaton = matcher.folded
                state = automaton.scan(self._folded_state, fold(normal), offset, found)
                self._folded_state = state
                hold = automaton.hold[state]
                self._add(found, matcher.folded_rule)
            if matcher.exact is not None:
                automaton = matcher.exact
                found.clear()
                state = self._exact_state = automaton.scan(self._exact_state, normal, offset, found)
                hold = max(hold, automaton.hold[state])
                self._add(found, matcher.exact_rule)
            self._hold_from = nn - hold
            if matcher.regexes:
                self._nbuf += normal
        undecided = self._regexes(final=final) if matcher.regexes else nn
        if final:
            cut = self._normalizer.fed
        else:
            cut = self._normalizer.stable
            first = min(self._hold_from, undecided)
            if first < nn:
                cut = min(cut, self._normalizer.map.start(first))
        said = self._render(cut)
        if resume is not None:
            self._q = resume
            undecided = min(resume, default=nn)
        self._trim(min(self._hold_from, undecided, nn))
        return said

    def _add(self, found: list[tuple[int, int, int]], rule_of: tuple[int, ...]) -> None:
        rules, spans = self._matcher.rules, self._normalizer.map
        for start, end, pid in found:
            rule = rules[rule_of[pid]]
            a, b = spans.start(start), spans.end(end - 1)
            self._known.append((a, 0 if rule.action == "block" else 1, a - b, rule.index, b))

    def _regexes(self, *, final: bool) -> int:
        """Runs each regex over the normalized starts now decidable; the first undecided one."""
        nbuf, nbase, nn = self._nbuf, self._nbase, self._nn
        rules, spans = self._matcher.rules, self._normalizer.map
        lowest = nn
        # RE2 reads UTF-8: ASCII text given as bytes spares its binding the encoding and the
        # offsets' decoding, and its byte offsets are the characters'.
        text: str | bytes = nbuf.encode("ascii") if nbuf.isascii() else nbuf
        for i, regex in enumerate(self._matcher.regexes):
            q = self._q[i]
            bound = nn if final else nn - regex.reach
            if q <= bound:
                # One pass of RE2 over what is held: linear in it, whatever the pattern.
                for m in regex.pattern.finditer(text, q - nbase):
                    start = m.start() + nbase
                    if start > bound:
                        break
                    end = m.end() + nbase
                    rule = rules[regex.rule]
                    a, b = spans.start(start), spans.end(end - 1)
                    block = 0 if rule.action == "block" else 1
                    self._known.append((a, block, a - b, rule.index, b))
                    q = end
                q = max(q, bound + 1)
                self._q[i] = q
            lowest = min(lowest, q)
        return lowest

    def _render(self, cut: int) -> str:
        """Says the text up to ``cut``, whose every occurrence is known by now."""
        emitted = self._emit
        if not self._known and self._mask_until <= emitted:  # most chunks: nothing to mask
            if cut <= emitted:
                return ""
            base = self._base
            said = self._buf[emitted - base : cut - base]
            self._buf = self._buf[cut - base :]
            self._emit = self._base = cut
            return said
        out: list[str] = []
        buf, base = self._buf, self._base
        mask_until = self._mask_until
        p = max(emitted, mask_until)
        known = self._known
        if known:
            known.sort()
            rules = self._matcher.rules
            taken = 0
            for start, _, _, index, end in known:
                if start >= cut:
                    break
                taken += 1
                rule = rules[index]
                if end <= emitted and rule.action != "block":
                    continue  # wholly in text a flush said: nothing left of it to mask
                self._matched.append(rule)
                if start < mask_until:
                    if rule.action == "block":
                        return self._block(rule, start, out)
                    mask_until = max(mask_until, end)
                    p = max(p, mask_until)
                    continue
                if p < start:
                    out.append(buf[p - base : start - base])
                if rule.action == "block":
                    return self._block(rule, start, out)
                out.append(rule.mask)
                mask_until = p = max(p, end)
            del known[:taken]
        if p < cut:
            out.append(buf[p - base : cut - base])
        self._emit = max(emitted, cut)
        self._mask_until = mask_until
        keep = self._emit
        if keep > base:
            self._buf = buf[keep - base :]
            self._base = keep
        return "".join(out)

    def _trim(self, needed: int) -> None:
        """Forgets the normalized text and map before what can still be read (``needed``)."""
        if self._q:
            keep = max(self._nbase, min(self._q) - self._matcher.context)
            if keep > self._nbase:
                self._nbuf = self._nbuf[keep - self._nbase :]
                self._nbase = keep
        self._normalizer.map.forget(needed)

    def _block(self, rule: Rule, start: int, out: list[str]) -> str:
        self.blocked = rule
        self._emit = max(self._emit, start)
        self._known.clear()
        self._buf = ""
        return "".join(out)


def mask_whole(matcher: Matcher, text: str) -> tuple[str, Rule | None]:
    """The reference: ``text`` masked whole, and the block that ended it if one did."""
    field = FieldFilter(matcher)
    out = field.feed(text) + field.close()
    return out, field.blocked
