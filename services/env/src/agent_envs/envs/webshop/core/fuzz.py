"""``token_set_ratio`` with the scoring of thefuzz 0.19.0 + python-Levenshtein, as the original reward uses it.

Processing: drop characters U+0080..U+00FF, replace every non-alphanumeric (regex ``\\W``) by a space,
lower-case, strip. Non-strings (the synthetic goals' option tuples) are first turned into ``str(value)``.
Score: with token sets A and B, ``sect = sorted(A & B)``, ``c1 = sect + sorted(A - B)``,
``c2 = sect + sorted(B - A)`` (space-joined, stripped), the maximum of ratio(sect, c1), ratio(sect, c2),
ratio(c1, c2), where ratio is ``round(100 * (L - d) / L)`` (Python's round: half to even), ``L`` the summed
length and ``d`` the insertion/deletion edit distance; an empty string scores 0 and equal strings 100.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

from rapidfuzz.distance import Indel

_LATIN1_DELETE = dict.fromkeys(range(128, 256))
_NON_ALNUM = re.compile(r"(?ui)\W")


def full_process(value: Any) -> str:
    text = value if isinstance(value, str) else str(value)
    text = text.translate(_LATIN1_DELETE)
    return _NON_ALNUM.sub(" ", text).lower().strip()


def ratio(a: str, b: str) -> int:
    """Levenshtein-style similarity in 0..100, rounded like thefuzz (banker's rounding)."""
    if a == b:
        return 100
    if not a or not b:
        return 0
    total = len(a) + len(b)
    distance = Indel.distance(a, b)
    return round(100 * ((total - distance) / total))


@lru_cache(maxsize=65536)
def _token_set_ratio_processed(a: str, b: str) -> int:
    if not a or not b:
        return 0
    tokens_a, tokens_b = set(a.split()), set(b.split())
    intersection = " ".join(sorted(tokens_a & tokens_b))
    only_a = " ".join(sorted(tokens_a - tokens_b))
    only_b = " ".join(sorted(tokens_b - tokens_a))
    combined_a = (intersection + " " + only_a).strip()
    combined_b = (intersection + " " + only_b).strip()
    return max(
        ratio(intersection, combined_a),
        ratio(intersection, combined_b),
        ratio(combined_a, combined_b),
    )


def token_set_ratio(a: Any, b: Any) -> int:
    """thefuzz 0.19.0 ``fuzz.token_set_ratio(a, b)`` (force_ascii and full_process on)."""
    return _token_set_ratio_processed(full_process(a), full_process(b))
