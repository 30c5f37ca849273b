"""Cheap text health measures for sample review (degenerate text). Pure.

``repetition_score`` is the native one (``streams._native``, built from ``native/src/text.rs``)
when it is built and ``RLWATCH_NATIVE`` is not ``"0"``; ``py_repetition_score`` below is the
reference it must match float for float (``tests/unit/test_native_text.py``)."""

from __future__ import annotations

import os

__all__ = ["CORE", "py_repetition_score", "repetition_score"]


def py_repetition_score(text: str, n: int = 3) -> float:
    """Share of repeated word n-grams in ``text`` (0 = all distinct, near 1 = a loop).

    Gibberish without spaces is split into character chunks so that ``"aaaaaaaa..."`` scores
    high too.

    >>> py_repetition_score("the cat sat on the mat")
    0.0
    >>> py_repetition_score("go go go go go go go go") > 0.8
    True
    """
    words = text.split()
    if len(words) < n + 2 and len(text) >= 40:
        words = [text[i:i + 4] for i in range(0, len(text), 4)]
    if len(words) < n + 1:
        return 0.0
    grams = list(zip(*(words[i:] for i in range(n))))   # the n-grams, in order
    return 1.0 - len(set(grams)) / len(grams)


# -- which one: the native one when it is built (as streams.signals picks its Bank) --------------
repetition_score = py_repetition_score
if os.environ.get("RLWATCH_NATIVE", "1") != "0":
    try:
        from streams._native import repetition_score  # type: ignore[no-redef]  # noqa: F811
    except ImportError:   # not built, or built before it had repetition_score: the Python one
        pass
#: the repetition_score in use: "native" or "pure"
CORE = "native" if repetition_score is not py_repetition_score else "pure"
