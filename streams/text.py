"""Cheap text health measures for sample review (degenerate text). Pure."""

from __future__ import annotations

__all__ = ["repetition_score"]


def repetition_score(text: str, n: int = 3) -> float:
    """Share of repeated word n-grams in ``text`` (0 = all distinct, near 1 = a loop).

    Gibberish without spaces is split into character chunks so that ``"aaaaaaaa..."`` scores
    high too.

    >>> repetition_score("the cat sat on the mat")
    0.0
    >>> repetition_score("go go go go go go go go") > 0.8
    True
    """
    words = text.split()
    if len(words) < n + 2 and len(text) >= 40:
        words = [text[i:i + 4] for i in range(0, len(text), 4)]
    if len(words) < n + 1:
        return 0.0
    grams = list(zip(*(words[i:] for i in range(n))))   # the n-grams, in order
    return 1.0 - len(set(grams)) / len(grams)
