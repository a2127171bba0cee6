"""The tokenizer's regexes give JFlex's longest-match tokens, and the ASCII fast path agrees with the full one."""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from agent_envs.envs.webshop.search.analyzer import _ASCII_PATTERN, _unicode_pattern, tokenize

ASCII_ALPHABET = "aZb9_0.,:;'\"- /$\t\n\x0b\x1c"  # with whitespace that str.split() splits at
UNICODE_ALPHABET = (
    ASCII_ALPHABET
    + (
        "é\u0301\u00adカー日ひกא❤\ufe0f\u200d👍🏻🇺#\u20e3©²٣１‿·’"  # marks, scripts, emoji parts, odd digits/joiners
    )
)


def longest_match_tokens(text: str, pattern: re.Pattern[str]) -> list[str]:
    """JFlex semantics spelled out: at each position take the longest prefix in the grammar's language."""
    tokens = []
    position = 0
    while position < len(text):
        end = next(
            (e for e in range(len(text), position, -1) if pattern.fullmatch(text, position, e)),
            None,
        )
        if end is None:
            position += 1
        else:
            tokens.append(text[position:end])
            position = end
    return tokens


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=UNICODE_ALPHABET, max_size=24))
def test_unicode_pattern_finds_the_longest_matches(text: str) -> None:
    pattern = _unicode_pattern()
    assert pattern.findall(text) == longest_match_tokens(text, pattern)


@settings(max_examples=400, deadline=None)
@given(st.text(alphabet=ASCII_ALPHABET, max_size=40))
def test_ascii_fast_path_equals_the_full_grammar(text: str) -> None:
    assert _ASCII_PATTERN.findall(text) == _unicode_pattern().findall(text)
    assert tokenize(text) == longest_match_tokens(text, _unicode_pattern())
