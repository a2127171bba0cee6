"""Lucene's PorterStemmer: Martin Porter's reference implementation of his algorithm, step for step.

It is not the algorithm as the 1980 paper prints it: like the reference C/Java code it maps "-bli" to "-ble"
(the paper: "-abli" to "-able") and adds "-logi" to "-log" in step 2. Snowball's "porter" stemmer has neither,
so it would give other terms than the original's index ("possibly" -> "possibl", "archaeology" ->
"archaeolog" here).

The steps are numbered as in Lucene's code (step1 = the paper's 1a+1b, step2 = 1c, step3 = 2, ... step6 = 5).
Words of one or two UTF-16 units are left alone, and the stemmer works on UTF-16 units as Java does.
"""

from __future__ import annotations

from functools import lru_cache

__all__ = ["stem"]

_VOWELS = frozenset("aeiou")
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyz")


class _Stemmer:
    """One word being stemmed: ``b`` holds the characters, the word is ``b[0..k]``; ``j`` marks a stem end."""

    __slots__ = ("b", "j", "k")

    def __init__(self, word: str) -> None:
        self.b = list(word)
        self.k = len(word) - 1
        self.j = 0

    def cons(self, i: int) -> bool:
        char = self.b[i]
        if char in _VOWELS:
            return False
        if char == "y":
            return True if i == 0 else not self.cons(i - 1)
        return True

    def m(self) -> int:
        """The number of vowel-consonant sequences in b[0..j]."""
        n = 0
        i = 0
        j = self.j
        while True:
            if i > j:
                return n
            if not self.cons(i):
                break
            i += 1
        i += 1
        while True:
            while True:
                if i > j:
                    return n
                if self.cons(i):
                    break
                i += 1
            i += 1
            n += 1
            while True:
                if i > j:
                    return n
                if not self.cons(i):
                    break
                i += 1
            i += 1

    def vowel_in_stem(self) -> bool:
        return any(not self.cons(i) for i in range(self.j + 1))

    def double_consonant(self, j: int) -> bool:
        if j < 1 or self.b[j] != self.b[j - 1]:
            return False
        return self.cons(j)

    def cvc(self, i: int) -> bool:
        """b[i-2..i] is consonant-vowel-consonant and the last one is not w, x or y."""
        if i < 2 or not self.cons(i) or self.cons(i - 1) or not self.cons(i - 2):
            return False
        return self.b[i] not in "wxy"

    def ends(self, suffix: str) -> bool:
        length = len(suffix)
        start = self.k - length + 1
        if start < 0 or "".join(self.b[start : self.k + 1]) != suffix:
            return False
        self.j = self.k - length
        return True

    def set_to(self, replacement: str) -> None:
        """Replace b[j+1..k] with ``replacement``."""
        start = self.j + 1
        del self.b[start:]
        self.b.extend(replacement)
        self.k = self.j + len(replacement)

    def replace_if_measure(self, replacement: str) -> None:
        if self.m() > 0:
            self.set_to(replacement)

    def step1(self) -> None:
        """Plurals and -ed / -ing."""
        b = self.b
        if b[self.k] == "s":
            if self.ends("sses"):
                self.k -= 2
            elif self.ends("ies"):
                self.set_to("i")
            elif b[self.k - 1] != "s":
                self.k -= 1
        if self.ends("eed"):
            if self.m() > 0:
                self.k -= 1
        elif (self.ends("ed") or self.ends("ing")) and self.vowel_in_stem():
            self.k = self.j
            if self.ends("at"):
                self.set_to("ate")
            elif self.ends("bl"):
                self.set_to("ble")
            elif self.ends("iz"):
                self.set_to("ize")
            elif self.double_consonant(self.k):
                if self.b[self.k] not in "lsz":
                    self.k -= 1
            elif self.m() == 1 and self.cvc(self.k):
                self.set_to("e")

    def step2(self) -> None:
        """Terminal y to i when there is another vowel in the stem."""
        if self.ends("y") and self.vowel_in_stem():
            self.b[self.k] = "i"

    def _first_rule(self, rules: tuple[tuple[str, str], ...]) -> None:
        """Apply the first rule whose suffix matches (and stop there even when the measure forbids it)."""
        for suffix, replacement in rules:
            if self.ends(suffix):
                self.replace_if_measure(replacement)
                return

    def step3(self) -> None:
        """Double suffixes to single ones (-ization -> -ize ...)."""
        if self.k == 0:
            return
        rules = _STEP3_RULES.get(self.b[self.k - 1])
        if rules:
            self._first_rule(rules)

    def step4(self) -> None:
        """-ic-, -full, -ness etc."""
        rules = _STEP4_RULES.get(self.b[self.k])
        if rules:
            self._first_rule(rules)

    def step5(self) -> None:
        """-ant, -ence etc. in context <c>vcvc<v>."""
        if self.k == 0:
            return
        suffixes = _STEP5_SUFFIXES.get(self.b[self.k - 1])
        if suffixes is None:
            return
        for suffix in suffixes:
            if self.ends(suffix):
                if suffix == "ion" and not (self.j >= 0 and self.b[self.j] in "st"):
                    continue
                break
        else:
            return
        if self.m() > 1:
            self.k = self.j

    def step6(self) -> None:
        """Remove a final -e, and -ll to -l, when the measure allows."""
        self.j = self.k
        if self.b[self.k] == "e":
            measure = self.m()
            if measure > 1 or (measure == 1 and not self.cvc(self.k - 1)):
                self.k -= 1
        if self.b[self.k] == "l" and self.double_consonant(self.k) and self.m() > 1:
            self.k -= 1

    def result(self) -> str:
        return "".join(self.b[: self.k + 1])


_STEP3_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "a": (("ational", "ate"), ("tional", "tion")),
    "c": (("enci", "ence"), ("anci", "ance")),
    "e": (("izer", "ize"),),
    "l": (("bli", "ble"), ("alli", "al"), ("entli", "ent"), ("eli", "e"), ("ousli", "ous")),
    "o": (("ization", "ize"), ("ation", "ate"), ("ator", "ate")),
    "s": (("alism", "al"), ("iveness", "ive"), ("fulness", "ful"), ("ousness", "ous")),
    "t": (("aliti", "al"), ("iviti", "ive"), ("biliti", "ble")),
    "g": (("logi", "log"),),
}
_STEP4_RULES: dict[str, tuple[tuple[str, str], ...]] = {
    "e": (("icate", "ic"), ("ative", ""), ("alize", "al")),
    "i": (("iciti", "ic"),),
    "l": (("ical", "ic"), ("ful", "")),
    "s": (("ness", ""),),
}
_STEP5_SUFFIXES: dict[str, tuple[str, ...]] = {
    "a": ("al",),
    "c": ("ance", "ence"),
    "e": ("er",),
    "i": ("ic",),
    "l": ("able", "ible"),
    "n": ("ant", "ement", "ment", "ent"),
    "o": ("ion", "ou"),
    "s": ("ism",),
    "t": ("ate", "iti"),
    "u": ("ous",),
    "v": ("ive",),
    "z": ("ize",),
}


def _stem_units(word: str) -> str:
    if len(word) <= 2 or word[-1] not in _LETTERS:
        # Every rule needs the word to end in a lower-case ASCII letter (a suffix or the 's', 'y', 'e', 'l' that
        # steps 1, 2 and 6 test), and no rule fires otherwise: numbers like "1080" come out unchanged.
        return word
    stemmer = _Stemmer(word)
    stemmer.step1()
    stemmer.step2()
    stemmer.step3()
    stemmer.step4()
    stemmer.step5()
    stemmer.step6()
    return stemmer.result()


@lru_cache(maxsize=1 << 18)
def stem(word: str) -> str:
    """The Porter stem of a lower-cased ``word``, exactly as Lucene's PorterStemFilter computes it."""
    if word.isascii() or max(word) <= "\uffff":
        return _stem_units(word)
    # Java stems UTF-16 code units: spell supplementary characters as surrogate pairs while stemming.
    units = word.encode("utf-16-le", "surrogatepass")
    spelled = "".join(chr(int.from_bytes(units[i : i + 2], "little")) for i in range(0, len(units), 2))
    return _stem_units(spelled).encode("utf-16-le", "surrogatepass").decode("utf-16-le")
