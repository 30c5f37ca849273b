"""The native repetition_score (native/src/text.rs, the degenerate_text rule's measure) gives
exactly the float of the Python one (streams.text.py_repetition_score, the reference), or the
same exception, for every text and n.

Like tests/unit/test_native_bank.py, these fail (they do not skip) when the native module is
missing, unless RLWATCH_NATIVE=0 says the pure core is wanted: CI builds it.
"""
from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit._core import PURE_ASKED  # noqa: E402

if PURE_ASKED:
    pytest.skip("RLWATCH_NATIVE=0: the pure core was asked for", allow_module_level=True)

try:
    from streams._native import repetition_score as native_score
except ImportError as e:   # a broken or old build must not pass silently
    raise AssertionError(
        f"streams._native has no repetition_score ({e}): rebuild it (scripts/install.sh), or "
        "set RLWATCH_NATIVE=0 to test the pure core only") from e

from streams import text as text_module  # noqa: E402
from streams.text import py_repetition_score  # noqa: E402

#: every character Python's str.split() splits on (str.isspace): not Rust's char::is_whitespace
PY_SPACES = [chr(c) for c in range(0x110000) if chr(c).isspace()]
#: look like spaces or are spaces elsewhere, but not to Python: they stay inside words
NOT_SPACES = ["\u200b", "\u180e", "\ufeff", "\u2060", "\u200c", "\u200d", "\x00", "\x7f",
              "\x1b", "\ud800", "\udfff"]


def outcome(f, *args, **kw):
    try:
        r = f(*args, **kw)
    except Exception as e:   # the native one must raise what the Python raises
        return ("raises", type(e).__name__, str(e))
    if isinstance(r, float):
        return ("float", struct.pack("<d", r))   # bit for bit
    return ("other", type(r).__name__, r)


def check(text, n=None):
    args = (text,) if n is None else (text, n)
    want, got = outcome(py_repetition_score, *args), outcome(native_score, *args)
    assert got == want, f"text {text!r} n {n!r}: Python {want}, native {got}"
    return want


def test_the_native_one_is_in_use():
    import streams.run

    assert text_module.CORE == "native"
    assert text_module.repetition_score is native_score
    assert streams.run.repetition_score is native_score   # what degenerate_text calls


def test_known_values():
    assert native_score("the cat sat on the mat") == 0.0
    assert native_score("go go go go go go go go") == 1.0 - 1 / 6
    assert native_score("a" * 80) == 1.0 - 1 / 18          # 20 chunks "aaaa", 18 trigrams
    assert native_score("") == 0.0
    assert native_score(text="a b a b a b", n=2) == 1.0 - 2 / 5


def test_python_whitespace_is_where_words_end():
    """Exactly the characters of str.isspace separate words, over the whole code point range
    (lone surrogates included): three words "go" score 1 - 1/3 with n=1, one word 0.0."""
    assert len(PY_SPACES) == 29 and "\x1c" in PY_SPACES and "\u200b" not in PY_SPACES
    wrong = []
    for c in range(0x110000):
        ch = chr(c)
        got = native_score(f"go{ch}go{ch}go", 1)
        if got != (1.0 - 1 / 3 if ch.isspace() else 0.0):
            wrong.append(hex(c))
    assert not wrong, f"split differently from Python at {wrong[:20]}"
    for ch in PY_SPACES + NOT_SPACES:
        for n in (1, 2, 3):
            check(f"go{ch}go{ch}go{ch}stop{ch}{ch}go go", n)
            check(ch.join(["ab", "cd"] * 6), n)


def test_every_whitespace_character_between_words():
    words = ["go", "stop", "go", "é", "go", "stop", "𝄞", "go", "stop", "go"]
    for ch in PY_SPACES + NOT_SPACES:
        for n in (1, 2, 3, 4):
            check(ch.join(words), n)
            check(ch * 3 + ch.join(words) + ch, n)
        check(ch * 45)            # spaces only, long: 4-character chunks of spaces
        check(ch * 10)


def test_empty_and_blank_texts():
    for n in (-3, -1, 0, 1, 2, 3, 5, 10**30, -(10**30)):
        for t in ("", " ", "\n\t ", " " * 39, " " * 40, " " * 41, "\u3000" * 40, "a", "a b"):
            check(t, n)


def test_loops():
    for unit in ("go ", "go go stop ", "the same line again\n", "ß ", "𝄞 x "):
        for k in (1, 2, 3, 4, 5, 7, 10, 100, 1000, 5000):
            for n in (1, 2, 3, 4, 6):
                check(unit * k, n)
    check("a" * 100_000)
    check("ab" * 50_001)



def test_many_distinct_words():
    """Thousands of distinct words repeated in a shuffled order: n-grams that share words."""
    import random

    rng = random.Random(7)
    vocab = [f"w{i}" for i in range(5000)] + [f"é{i}" for i in range(300)]
    for size in (10, 300, 3000, 20000):
        t = " ".join(rng.choice(vocab[: size // 3 + 2]) for _ in range(size))
        for n in (1, 2, 3, 4, 7):
            check(t, n)

def test_gibberish_without_spaces_goes_by_four_character_chunks():
    for k in range(30, 60):
        check("abcdefghij"[: k % 7 + 1] * (k // (k % 7 + 1) + 1))
        check("x" * k)
        check("𝄞é" * k)
        check("\ud800a" * k)      # a lone surrogate is a code point too


def test_branch_edges():
    """Length about 40 (the chunk switch) and n+1, n+2, n+3 words (the word-count tests)."""
    for n in range(1, 6):
        for words in (n, n + 1, n + 2, n + 3):
            for length in range(34, 47):
                # `words` words, the last padded so that the text is `length` code points long
                base = ["w"] * words
                pad = length - (2 * words - 1)
                if pad < 0:
                    continue
                base[-1] += "a" * pad
                t = " ".join(base)
                assert len(t) == length
                check(t, n)
                check(t.replace("w", "é"), n)
                check(t.replace(" ", "\u2028"), n)


def test_n_other_than_three():
    t = "one two three one two three one two four " * 5
    for n in range(-3, 50):
        check(t, n)
    for n in (True, False, 2**63 - 1, -(2**63), 2**63, 2**200, -(2**200)):
        check(t, n)
        check("", n)
    for n in (None, 3.0, "3"):   # not ints: whatever the Python does (here a TypeError)
        check(t, n)
        check("ab", n)


def test_not_a_str_behaves_as_the_python():
    class S(str):
        def split(self):
            return ["x"] * 10

    check(S("a b c"))
    check(b"go go go go go go")
    check(None)


SPACEY = st.sampled_from(PY_SPACES + NOT_SPACES + list("ab"))


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=()), max_size=120),
       st.integers(min_value=-2, max_value=8))
def test_arbitrary_unicode_text(text, n):
    check(text, n)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.sampled_from(["go", "stop", "a", "é", "𝄞", "aaaa", "aa"]), max_size=40),
       st.lists(st.text(SPACEY, min_size=1, max_size=3), min_size=1, max_size=40),
       st.integers(min_value=0, max_value=6))
def test_words_between_any_whitespace(words, seps, n):
    t = "".join(w + seps[i % len(seps)] for i, w in enumerate(words))
    check(t, n)
    check(seps[0] + t, n)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(exclude_categories=("Zs", "Zl", "Zp", "Cc")),
               min_size=0, max_size=200),
       st.integers(min_value=1, max_value=5))
def test_arbitrary_gibberish_without_spaces(text, n):
    check(text, n)


def test_long_texts_and_a_text_after_a_very_large_one():
    # samples' responses run to hundreds of words, loops and all: the words are known by a
    # hash of their characters, checked against the first word of that hash, and the tables
    # are kept from one text to the next (one grown by a very large text is let go)
    import random

    rng = random.Random(7)
    vocab = ["the", "cat", "sat", "é", "𝄞", "中文", "go", "Go", "og", "a", "aa", "\u00a0x"]
    for _ in range(60):
        words = [rng.choice(vocab) + rng.choice(["", "", str(rng.randrange(50))])
                 for _ in range(rng.randrange(100, 1500))]
        if rng.random() < 0.3:          # a degenerate loop at the end
            words += words[-7:] * rng.randrange(5, 40)
        text = rng.choice([" ", "\n", " \t "]).join(words)
        for n in (1, 2, 3, 4):
            check(text, n)
    huge = " ".join(f"w{i}" for i in range(120_000))     # more distinct words than kept
    check(huge)
    check(huge, 2)
    check("loop loop loop loop loop loop")
    check("x" * 4000)                  # no spaces: chunks of four characters
