"""The text analysis chain of the original's search: Anserini's DefaultEnglishAnalyzer (Lucene 8).

StandardTokenizer (UAX#29 word breaks as Lucene's JFlex grammar implements them, Unicode 9.0 classes) ->
EnglishPossessiveFilter -> LowerCaseFilter -> StopFilter (Lucene's 33 English stop words) -> PorterStemFilter.

Documents and queries go through the same chain, so the index terms and the query terms agree exactly with what
the original's Lucene index held; any difference here changes document lengths (norms) or matches, and so the
ranking.
"""

from __future__ import annotations

import re
from functools import lru_cache

from .porter import stem

__all__ = [
    "MAX_TOKEN_LENGTH",
    "STOP_WORDS",
    "analyze",
    "lower_case",
    "normalize_token",
    "strip_possessive",
    "tokenize",
]

MAX_TOKEN_LENGTH = 255  # StandardAnalyzer.DEFAULT_MAX_TOKEN_LENGTH: longer tokens are chopped

# EnglishAnalyzer.ENGLISH_STOP_WORDS_SET, which Anserini's DefaultEnglishAnalyzer uses.
STOP_WORDS = frozenset(
    {
        "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not",
        "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was",
        "will", "with",
    }
)  # fmt: skip

_POSSESSIVE_APOSTROPHES = ("'", "\u2019", "\uff07")


def _char_class(*names: str, without: str = "") -> str:
    """A regex character class made of embedded tables, minus the characters in ``without``."""
    removed = sorted(ord(c) for c in without)
    parts = []
    for name in names:
        for item in _TABLES[name].split():
            low, _, high = item.partition("-")
            start, end = int(low, 16), int(high or low, 16)
            for point in removed:
                if start <= point <= end:
                    if point > start:
                        parts.append((start, point - 1))
                    start = point + 1
            if start <= end:
                parts.append((start, end))
    body = "".join(f"\\U{a:08x}" if a == b else f"\\U{a:08x}-\\U{b:08x}" for a, b in parts)
    return f"[{body}]"


@lru_cache(maxsize=1)
def _unicode_pattern() -> re.Pattern[str]:
    """Lucene's StandardTokenizerImpl.jflex rules as one regex; first-match order gives its longest matches.

    The JFlex grammar returns the longest match of: emoji sequences, words (WB5-WB13b: letters, digits,
    katakana and ``_``-like joiners, with single mid characters between two letters or two digits),
    South-East-Asian runs, single Han or Hiragana characters; anything else is skipped. Every character
    may carry trailing Extend/Format/ZWJ characters (WB4). Compiled on first use: it takes ~0.2 s.
    """
    x = _char_class("EXTEND") + "*"
    letter, hebrew, numeric = _char_class("LETTER"), _char_class("HEBREW"), _char_class("NUMERIC")
    mid_letter, mid_numeric = _char_class("MID_LETTER"), _char_class("MID_NUMERIC")
    joiner = f"{_char_class('EXTEND_NUM_LET')}{x}"
    katakana = f"{_char_class('KATAKANA')}{x}"
    step = (  # one group of the grammar's word rule; groups follow each other directly or across joiners
        f"{hebrew}{x}(?:'{x}|\"{x}{hebrew}{x})"  # WB7a-c (not after a mid character: that letter is taken)
        f"|{letter}{x}(?:{mid_letter}{x}{letter}{x})*"  # WB5-7, WB9-10
        f"|{numeric}{x}(?:{mid_numeric}{x}{numeric}{x})*"  # WB8, WB11-12
    )
    katakana_run = f"{katakana}(?:(?:{joiner})*{katakana})*"  # WB13, WB13a-b
    letter_run = f"(?:{step})(?:(?:{joiner})*(?:{step}))*"
    run = f"(?:{katakana_run}|{letter_run})"
    word = f"(?:{joiner})*{run}(?:(?:{joiner})+{run})*(?:{joiner})*"

    # Emoji sequences (UTS#51, as Lucene's grammar spells them). Inside them WB4 leaves out the presentation
    # selectors, and a ZWJ is an ignorable character only when it does not join the next emoji (ZWJs may lead
    # into an emoji or a modifier base, one ZWJ into a lone modifier).
    base, modifier = _char_class("EMOJI_MODIFIER_BASE"), _char_class("EMOJI_MODIFIER")
    ignorable = _char_class("EXTEND", without="\ufe0e\ufe0f\u200d")
    xs = f"(?:{ignorable}|\u200d(?!\u200d*{_char_class('EMOJI', 'EMOJI_MODIFIER_BASE')}|{modifier}))*"
    emoji_part = f"(?:(?:\u200d*{base}{xs})?{modifier}{xs}|\u200d*{_char_class('EMOJI')}{xs}\ufe0f?)"
    keycap_x = _char_class("EXTEND", without="\ufe0e\ufe0f") + "*"
    emoji = (
        f"{emoji_part}(?:(?:\u200d{emoji_part})+|[\U000e0020-\U000e007e]+\U000e007f)?"
        f"|[0-9#*]{keycap_x}\ufe0f?\u20e3{keycap_x}"  # keycaps
        f"|{_char_class('REGIONAL')}{x}{_char_class('REGIONAL')}{x}"  # flags
    )
    south_east_asian = f"(?:{_char_class('COMPLEX_CONTEXT')}{x})+"
    single = f"{_char_class('IDEOGRAPHIC')}{x}"
    # ℹ Ⓜ 🅰 🅱 🅾 🅿 are letters and emoji: a ZWJ sequence from one of them is longer as an emoji token.
    letter_emoji = _char_class("LETTER_EMOJI")
    joined_letter_emoji = f"{letter_emoji}{xs}\ufe0f?(?:\u200d{emoji_part})+"
    return re.compile(f"{joined_letter_emoji}|{word}|{emoji}|{south_east_asian}|{single}")


# For pure-ASCII text the grammar reduces to: runs of [A-Za-z0-9_] holding at least one letter or digit, joined
# by one of :.' between two letters or one of ,;.' between two digits.
_ASCII_PATTERN = re.compile(
    r"_*[A-Za-z0-9]\w*(?:(?:(?<=[A-Za-z])[:.'](?=[A-Za-z])|(?<=[0-9])[,;.'](?=[0-9]))\w+)*", re.ASCII
)
# A run of non-whitespace holding a non-ASCII character (the lookbehind makes matching start at run starts only).
_NON_ASCII_PIECE = re.compile(r"(?<![^ \t\n\r\f\v])[^ \t\n\r\f\v]*?[^\x00-\x7f][^ \t\n\r\f\v]*")


def tokenize(text: str) -> list[str]:
    """Lucene 8 StandardTokenizer: the UAX#29 words of ``text``, chopped at 255 characters.

    Tokens never hold ASCII whitespace, so only the whitespace-separated pieces that contain a non-ASCII
    character need the (several times slower) full grammar; the ASCII stretches between them take the fast
    path. (Lucene counts the 255 in UTF-16 units, this in code points: they differ only for tokens made of
    more than 127 supplementary characters.)
    """
    if text.isascii():
        # Word by word (a token never holds whitespace): most words are letters and digits only, which are
        # one token each, and only the others need the pattern (2x faster than one findall over the text).
        tokens = []
        for word in text.split():
            if word.isalnum():
                tokens.append(word)
            else:
                tokens += _ASCII_PATTERN.findall(word)
        pattern = _ASCII_PATTERN
    else:
        pattern = _unicode_pattern()
        tokens = []
        position = 0
        for piece in _NON_ASCII_PIECE.finditer(text):
            start, end = piece.span()
            if start > position:
                tokens += _ASCII_PATTERN.findall(text, position, start)
            tokens += pattern.findall(text, start, end)
            position = end
        tokens += _ASCII_PATTERN.findall(text, position)
    if len(text) > MAX_TOKEN_LENGTH and tokens and len(max(tokens, key=len)) > MAX_TOKEN_LENGTH:
        tokens = _chop_long_tokens(tokens, pattern)
    return tokens


def _chop_long_tokens(tokens: list[str], pattern: re.Pattern[str]) -> list[str]:
    """Split tokens longer than the scanner's 255-character buffer, as Lucene's tokenizer does.

    The scanner cannot look past its buffer, so it returns the longest token within the first 255 characters
    and starts again right after it.
    """
    out: list[str] = []
    for token in tokens:
        if len(token) <= MAX_TOKEN_LENGTH:
            out.append(token)
            continue
        position = 0
        while position < len(token):
            match = pattern.match(token, position, min(position + MAX_TOKEN_LENGTH, len(token)))
            if match is None or match.end() == position:
                position += 1
                continue
            out.append(match.group())
            position = match.end()
    return out


def strip_possessive(token: str) -> str:
    """EnglishPossessiveFilter: drop a trailing 's (with ', ’ or ＇, and s or S)."""
    if len(token) >= 2 and token[-1] in "sS" and token[-2] in _POSSESSIVE_APOSTROPHES:
        return token[:-2]
    return token


def lower_case(token: str) -> str:
    """LowerCaseFilter: Java's Character.toLowerCase per code point (simple mappings, no context).

    ``str.lower`` differs on two points: it maps a final capital sigma to "ς" and "İ" to "i" + U+0307.
    """
    if token.isascii():
        return token.lower()
    return "".join("i" if char == "\u0130" else char.lower() for char in token)


@lru_cache(maxsize=1 << 18)
def normalize_token(token: str) -> str | None:
    """One tokenizer token through possessive, lower-case, stop and Porter filters; None for a stop word."""
    term = lower_case(strip_possessive(token))
    if term in STOP_WORDS:
        return None
    return stem(term)


def analyze(text: str) -> list[str]:
    """The index terms of ``text`` in order (what Lucene indexes for a document or searches for a query)."""
    terms = []
    for token in tokenize(text):
        term = normalize_token(token)
        if term is not None:
            terms.append(term)
    return terms


# --- Unicode character classes --------------------------------------------------------------------------------
# Code point ranges (hex) of the character classes of Lucene 8's StandardTokenizerImpl (JFlex, Unicode 9.0 word
# break properties, emoji data 11.0). They were read off Lucene 8.7's tokenizer itself, one code point at a time
# in telling contexts ("x", "axa", "1x1", "xa", "xx", "a.x", "1.x", ...), so code points that Unicode assigned
# after 9.0 are in no class, as there. The emoji classes are Lucene's emoji 11.0 tables.
#   LETTER           WB=ALetter | Hebrew_Letter    HEBREW          WB=Hebrew_Letter
#   NUMERIC          WB=Numeric | fullwidth digits KATAKANA        WB=Katakana
#   MID_LETTER       WB=MidLetter | MidNumLet | Single_Quote
#   MID_NUMERIC      WB=MidNum | MidNumLet | Single_Quote
#   EXTEND_NUM_LET   WB=ExtendNumLet               EXTEND          WB=Extend | Format | ZWJ
#   REGIONAL         WB=Regional_Indicator         IDEOGRAPHIC     Script=Han | Script=Hiragana
#   COMPLEX_CONTEXT  Line_Break=SA (South-East-Asian scripts; their marks are in EXTEND too)
#   EMOJI            Extended_Pictographic | Emoji, less regional indicators, keycap bases, ©®™〰〽 and
#                    modifiers (©®™〰〽 are Extended_Pictographic, so they stay)
#   EMOJI_MODIFIER_BASE, EMOJI_MODIFIER   Emoji_Modifier_Base, Emoji_Modifier
#   LETTER_EMOJI     the letters that are emoji too
_TABLES: dict[str, str] = {
    "LETTER": (
        "41-5A 61-7A AA B5 BA C0-D6 D8-F6 F8-2C1 2C6-2D1 2E0-2E4 2EC 2EE 370-374 376-377 37A-37D 37F 386 "
        "388-38A 38C 38E-3A1 3A3-3F5 3F7-481 48A-52F 531-556 559 561-587 5D0-5EA 5F0-5F3 620-64A 66E-66F "
        "671-6D3 6D5 6E5-6E6 6EE-6EF 6FA-6FC 6FF 710 712-72F 74D-7A5 7B1 7CA-7EA 7F4-7F5 7FA 800-815 81A "
        "824 828 840-858 8A0-8B4 8B6-8BD 904-939 93D 950 958-961 971-980 985-98C 98F-990 993-9A8 9AA-9B0 "
        "9B2 9B6-9B9 9BD 9CE 9DC-9DD 9DF-9E1 9F0-9F1 A05-A0A A0F-A10 A13-A28 A2A-A30 A32-A33 A35-A36 "
        "A38-A39 A59-A5C A5E A72-A74 A85-A8D A8F-A91 A93-AA8 AAA-AB0 AB2-AB3 AB5-AB9 ABD AD0 AE0-AE1 AF9 "
        "B05-B0C B0F-B10 B13-B28 B2A-B30 B32-B33 B35-B39 B3D B5C-B5D B5F-B61 B71 B83 B85-B8A B8E-B90 "
        "B92-B95 B99-B9A B9C B9E-B9F BA3-BA4 BA8-BAA BAE-BB9 BD0 C05-C0C C0E-C10 C12-C28 C2A-C39 C3D "
        "C58-C5A C60-C61 C80 C85-C8C C8E-C90 C92-CA8 CAA-CB3 CB5-CB9 CBD CDE CE0-CE1 CF1-CF2 D05-D0C "
        "D0E-D10 D12-D3A D3D D4E D54-D56 D5F-D61 D7A-D7F D85-D96 D9A-DB1 DB3-DBB DBD DC0-DC6 F00 F40-F47 "
        "F49-F6C F88-F8C 10A0-10C5 10C7 10CD 10D0-10FA 10FC-1248 124A-124D 1250-1256 1258 125A-125D "
        "1260-1288 128A-128D 1290-12B0 12B2-12B5 12B8-12BE 12C0 12C2-12C5 12C8-12D6 12D8-1310 1312-1315 "
        "1318-135A 1380-138F 13A0-13F5 13F8-13FD 1401-166C 166F-167F 1681-169A 16A0-16EA 16EE-16F8 "
        "1700-170C 170E-1711 1720-1731 1740-1751 1760-176C 176E-1770 1820-1877 1880-1884 1887-18A8 18AA "
        "18B0-18F5 1900-191E 1A00-1A16 1B05-1B33 1B45-1B4B 1B83-1BA0 1BAE-1BAF 1BBA-1BE5 1C00-1C23 "
        "1C4D-1C4F 1C5A-1C7D 1C80-1C88 1CE9-1CEC 1CEE-1CF1 1CF5-1CF6 1D00-1DBF 1E00-1F15 1F18-1F1D "
        "1F20-1F45 1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D 1F5F-1F7D 1F80-1FB4 1FB6-1FBC 1FBE 1FC2-1FC4 "
        "1FC6-1FCC 1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4 1FF6-1FFC 2071 207F 2090-209C 2102 2107 "
        "210A-2113 2115 2119-211D 2124 2126 2128 212A-212D 212F-2139 213C-213F 2145-2149 214E 2160-2188 "
        "24B6-24E9 2C00-2C2E 2C30-2C5E 2C60-2CE4 2CEB-2CEE 2CF2-2CF3 2D00-2D25 2D27 2D2D 2D30-2D67 2D6F "
        "2D80-2D96 2DA0-2DA6 2DA8-2DAE 2DB0-2DB6 2DB8-2DBE 2DC0-2DC6 2DC8-2DCE 2DD0-2DD6 2DD8-2DDE 2E2F "
        "3005 303B-303C 3105-312D 3131-318E 31A0-31BA A000-A48C A4D0-A4FD A500-A60C A610-A61F A62A-A62B "
        "A640-A66E A67F-A69D A6A0-A6EF A717-A71F A722-A788 A78B-A7AE A7B0-A7B7 A7F7-A801 A803-A805 "
        "A807-A80A A80C-A822 A840-A873 A882-A8B3 A8F2-A8F7 A8FB A8FD A90A-A925 A930-A946 A960-A97C "
        "A984-A9B2 A9CF AA00-AA28 AA40-AA42 AA44-AA4B AAE0-AAEA AAF2-AAF4 AB01-AB06 AB09-AB0E AB11-AB16 "
        "AB20-AB26 AB28-AB2E AB30-AB5A AB5C-AB65 AB70-ABE2 AC00-D7A3 D7B0-D7C6 D7CB-D7FB FB00-FB06 "
        "FB13-FB17 FB1D FB1F-FB28 FB2A-FB36 FB38-FB3C FB3E FB40-FB41 FB43-FB44 FB46-FBB1 FBD3-FD3D "
        "FD50-FD8F FD92-FDC7 FDF0-FDFB FE70-FE74 FE76-FEFC FF21-FF3A FF41-FF5A FFA0-FFBE FFC2-FFC7 "
        "FFCA-FFCF FFD2-FFD7 FFDA-FFDC 10000-1000B 1000D-10026 10028-1003A 1003C-1003D 1003F-1004D "
        "10050-1005D 10080-100FA 10140-10174 10280-1029C 102A0-102D0 10300-1031F 10330-1034A 10350-10375 "
        "10380-1039D 103A0-103C3 103C8-103CF 103D1-103D5 10400-1049D 104B0-104D3 104D8-104FB 10500-10527 "
        "10530-10563 10600-10736 10740-10755 10760-10767 10800-10805 10808 1080A-10835 10837-10838 1083C "
        "1083F-10855 10860-10876 10880-1089E 108E0-108F2 108F4-108F5 10900-10915 10920-10939 10980-109B7 "
        "109BE-109BF 10A00 10A10-10A13 10A15-10A17 10A19-10A33 10A60-10A7C 10A80-10A9C 10AC0-10AC7 "
        "10AC9-10AE4 10B00-10B35 10B40-10B55 10B60-10B72 10B80-10B91 10C00-10C48 10C80-10CB2 10CC0-10CF2 "
        "11003-11037 11083-110AF 110D0-110E8 11103-11126 11150-11172 11176 11183-111B2 111C1-111C4 111DA "
        "111DC 11200-11211 11213-1122B 11280-11286 11288 1128A-1128D 1128F-1129D 1129F-112A8 112B0-112DE "
        "11305-1130C 1130F-11310 11313-11328 1132A-11330 11332-11333 11335-11339 1133D 11350 1135D-11361 "
        "11400-11434 11447-1144A 11480-114AF 114C4-114C5 114C7 11580-115AE 115D8-115DB 11600-1162F 11644 "
        "11680-116AA 118A0-118DF 118FF 11AC0-11AF8 11C00-11C08 11C0A-11C2E 11C40 11C72-11C8F 12000-12399 "
        "12400-1246E 12480-12543 13000-1342E 14400-14646 16800-16A38 16A40-16A5E 16AD0-16AED 16B00-16B2F "
        "16B40-16B43 16B63-16B77 16B7D-16B8F 16F00-16F44 16F50 16F93-16F9F 16FE0 1BC00-1BC6A 1BC70-1BC7C "
        "1BC80-1BC88 1BC90-1BC99 1D400-1D454 1D456-1D49C 1D49E-1D49F 1D4A2 1D4A5-1D4A6 1D4A9-1D4AC "
        "1D4AE-1D4B9 1D4BB 1D4BD-1D4C3 1D4C5-1D505 1D507-1D50A 1D50D-1D514 1D516-1D51C 1D51E-1D539 "
        "1D53B-1D53E 1D540-1D544 1D546 1D54A-1D550 1D552-1D6A5 1D6A8-1D6C0 1D6C2-1D6DA 1D6DC-1D6FA "
        "1D6FC-1D714 1D716-1D734 1D736-1D74E 1D750-1D76E 1D770-1D788 1D78A-1D7A8 1D7AA-1D7C2 1D7C4-1D7CB "
        "1E800-1E8C4 1E900-1E943 1EE00-1EE03 1EE05-1EE1F 1EE21-1EE22 1EE24 1EE27 1EE29-1EE32 1EE34-1EE37 "
        "1EE39 1EE3B 1EE42 1EE47 1EE49 1EE4B 1EE4D-1EE4F 1EE51-1EE52 1EE54 1EE57 1EE59 1EE5B 1EE5D 1EE5F "
        "1EE61-1EE62 1EE64 1EE67-1EE6A 1EE6C-1EE72 1EE74-1EE77 1EE79-1EE7C 1EE7E 1EE80-1EE89 1EE8B-1EE9B "
        "1EEA1-1EEA3 1EEA5-1EEA9 1EEAB-1EEBB 1F130-1F149 1F150-1F169 1F170-1F189 "
    ),
    "HEBREW": "5D0-5EA 5F0-5F2 FB1D FB1F-FB28 FB2A-FB36 FB38-FB3C FB3E FB40-FB41 FB43-FB44 FB46-FB4F",
    "NUMERIC": (
        "30-39 660-669 66B 6F0-6F9 7C0-7C9 966-96F 9E6-9EF A66-A6F AE6-AEF B66-B6F BE6-BEF C66-C6F "
        "CE6-CEF D66-D6F DE6-DEF E50-E59 ED0-ED9 F20-F29 1040-1049 1090-1099 17E0-17E9 1810-1819 "
        "1946-194F 19D0-19D9 1A80-1A89 1A90-1A99 1B50-1B59 1BB0-1BB9 1C40-1C49 1C50-1C59 A620-A629 "
        "A8D0-A8D9 A900-A909 A9D0-A9D9 A9F0-A9F9 AA50-AA59 ABF0-ABF9 FF10-FF19 104A0-104A9 11066-1106F "
        "110F0-110F9 11136-1113F 111D0-111D9 112F0-112F9 11450-11459 114D0-114D9 11650-11659 116C0-116C9 "
        "11730-11739 118E0-118E9 11C50-11C59 16A60-16A69 16B50-16B59 1D7CE-1D7FF 1E950-1E959 "
    ),
    "KATAKANA": "3031-3035 309B-309C 30A0-30FA 30FC-30FF 31F0-31FF 32D0-32FE 3300-3357 FF66-FF9D 1B000",
    "MID_LETTER": "27 2E 3A B7 2D7 387 5F4 2018-2019 2024 2027 FE13 FE52 FE55 FF07 FF0E FF1A",
    "MID_NUMERIC": (
        "27 2C 2E 3B 37E 589 60C-60D 66C 7F8 2018-2019 2024 2044 FE10 FE14 FE50 FE52 FE54 FF07 FF0C FF0E "
        "FF1B "
    ),
    "EXTEND_NUM_LET": "5F 202F 203F-2040 2054 FE33-FE34 FE4D-FE4F FF3F",
    "EXTEND": (
        "AD 300-36F 483-489 591-5BD 5BF 5C1-5C2 5C4-5C5 5C7 600-605 610-61A 61C 64B-65F 670 6D6-6DD "
        "6DF-6E4 6E7-6E8 6EA-6ED 70F 711 730-74A 7A6-7B0 7EB-7F3 816-819 81B-823 825-827 829-82D 859-85B "
        "8D4-903 93A-93C 93E-94F 951-957 962-963 981-983 9BC 9BE-9C4 9C7-9C8 9CB-9CD 9D7 9E2-9E3 A01-A03 "
        "A3C A3E-A42 A47-A48 A4B-A4D A51 A70-A71 A75 A81-A83 ABC ABE-AC5 AC7-AC9 ACB-ACD AE2-AE3 B01-B03 "
        "B3C B3E-B44 B47-B48 B4B-B4D B56-B57 B62-B63 B82 BBE-BC2 BC6-BC8 BCA-BCD BD7 C00-C03 C3E-C44 "
        "C46-C48 C4A-C4D C55-C56 C62-C63 C81-C83 CBC CBE-CC4 CC6-CC8 CCA-CCD CD5-CD6 CE2-CE3 D01-D03 "
        "D3E-D44 D46-D48 D4A-D4D D57 D62-D63 D82-D83 DCA DCF-DD4 DD6 DD8-DDF DF2-DF3 E31 E34-E3A E47-E4E "
        "EB1 EB4-EB9 EBB-EBC EC8-ECD F18-F19 F35 F37 F39 F3E-F3F F71-F84 F86-F87 F8D-F97 F99-FBC FC6 "
        "102B-103E 1056-1059 105E-1060 1062-1064 1067-106D 1071-1074 1082-108D 108F 109A-109D 135D-135F "
        "1712-1714 1732-1734 1752-1753 1772-1773 17B4-17D3 17DD 180B-180E 1885-1886 18A9 1920-192B "
        "1930-193B 1A17-1A1B 1A55-1A5E 1A60-1A7C 1A7F 1AB0-1ABE 1B00-1B04 1B34-1B44 1B6B-1B73 1B80-1B82 "
        "1BA1-1BAD 1BE6-1BF3 1C24-1C37 1CD0-1CD2 1CD4-1CE8 1CED 1CF2-1CF4 1CF8-1CF9 1DC0-1DF5 1DFB-1DFF "
        "200C-200F 202A-202E 2060-2064 2066-206F 20D0-20F0 2CEF-2CF1 2D7F 2DE0-2DFF 302A-302F 3099-309A "
        "A66F-A672 A674-A67D A69E-A69F A6F0-A6F1 A802 A806 A80B A823-A827 A880-A881 A8B4-A8C5 A8E0-A8F1 "
        "A926-A92D A947-A953 A980-A983 A9B3-A9C0 A9E5 AA29-AA36 AA43 AA4C-AA4D AA7B-AA7D AAB0 AAB2-AAB4 "
        "AAB7-AAB8 AABE-AABF AAC1 AAEB-AAEF AAF5-AAF6 ABE3-ABEA ABEC-ABED FB1E FE00-FE0F FE20-FE2F FEFF "
        "FF9E-FF9F FFF9-FFFB 101FD 102E0 10376-1037A 10A01-10A03 10A05-10A06 10A0C-10A0F 10A38-10A3A "
        "10A3F 10AE5-10AE6 11000-11002 11038-11046 1107F-11082 110B0-110BA 110BD 11100-11102 11127-11134 "
        "11173 11180-11182 111B3-111C0 111CA-111CC 1122C-11237 1123E 112DF-112EA 11300-11303 1133C "
        "1133E-11344 11347-11348 1134B-1134D 11357 11362-11363 11366-1136C 11370-11374 11435-11446 "
        "114B0-114C3 115AF-115B5 115B8-115C0 115DC-115DD 11630-11640 116AB-116B7 1171D-1172B 11C2F-11C36 "
        "11C38-11C3F 11C92-11CA7 11CA9-11CB6 16AF0-16AF4 16B30-16B36 16F51-16F7E 16F8F-16F92 1BC9D-1BC9E "
        "1BCA0-1BCA3 1D165-1D169 1D16D-1D182 1D185-1D18B 1D1AA-1D1AD 1D242-1D244 1DA00-1DA36 1DA3B-1DA6C "
        "1DA75 1DA84 1DA9B-1DA9F 1DAA1-1DAAF 1E000-1E006 1E008-1E018 1E01B-1E021 1E023-1E024 1E026-1E02A "
        "1E8D0-1E8D6 1E944-1E94A E0001 E0020-E007F E0100-E01EF "
    ),
    "REGIONAL": "1F1E6-1F1FF",
    "COMPLEX_CONTEXT": (
        "E01-E3A E40-E4E E81-E82 E84 E87-E88 E8A E8D E94-E97 E99-E9F EA1-EA3 EA5 EA7 EAA-EAB EAD-EB9 "
        "EBB-EBD EC0-EC4 EC6 EC8-ECD EDC-EDF 1000-103F 1050-108F 109A-109F 1780-17D3 17D7 17DC-17DD "
        "1950-196D 1970-1974 1980-19AB 19B0-19C9 19DA 19DE-19DF 1A20-1A5E 1A60-1A7C 1AA0-1AAD A9E0-A9EF "
        "A9FA-A9FE AA60-AAC2 AADB-AADF 11700-11719 1171D-1172B 1173A-1173B 1173F "
    ),
    "IDEOGRAPHIC": (
        "2E80-2E99 2E9B-2EF3 2F00-2FD5 3007 3021-3029 3038-303A 3041-3096 309D-309F 3400-4DB5 4E00-9FD5 "
        "F900-FA6D FA70-FAD9 1B001 1F200 20000-2A6D6 2A700-2B734 2B740-2B81D 2B820-2CEA1 2F800-2FA1D "
    ),
    "EMOJI": (
        "A9 AE 203C 2049 2122 2139 2194-2199 21A9-21AA 231A-231B 2328 2388 23CF 23E9-23F3 23F8-23FA 24C2 "
        "25AA-25AB 25B6 25C0 25FB-25FE 2600-2605 2607-2612 2614-2685 2690-2705 2708-2712 2714 2716 271D "
        "2721 2728 2733-2734 2744 2747 274C 274E 2753-2755 2757 2763-2767 2795-2797 27A1 27B0 27BF "
        "2934-2935 2B05-2B07 2B1B-2B1C 2B50 2B55 3030 303D 3297 3299 1F000-1F0FF 1F10D-1F10F 1F12F "
        "1F16C-1F171 1F17E-1F17F 1F18E 1F191-1F19A 1F1AD-1F1E5 1F201-1F20F 1F21A 1F22F 1F232-1F23A "
        "1F23C-1F23F 1F249-1F3FA 1F400-1F53D 1F546-1F64F 1F680-1F6FF 1F774-1F77F 1F7D5-1F7FF 1F80C-1F80F "
        "1F848-1F84F 1F85A-1F85F 1F888-1F88F 1F8AE-1F8FF 1F90C-1F93A 1F93C-1F945 1F947-1FFFD "
    ),
    "EMOJI_MODIFIER_BASE": (
        "261D 26F9 270A-270D 1F385 1F3C2-1F3C4 1F3C7 1F3CA-1F3CC 1F442-1F443 1F446-1F450 1F466-1F469 "
        "1F46E 1F470-1F478 1F47C 1F481-1F483 1F485-1F487 1F4AA 1F574-1F575 1F57A 1F590 1F595-1F596 "
        "1F645-1F647 1F64B-1F64F 1F6A3 1F6B4-1F6B6 1F6C0 1F6CC 1F918-1F91C 1F91E-1F91F 1F926 1F930-1F939 "
        "1F93D-1F93E 1F9B5-1F9B6 1F9B8-1F9B9 1F9D1-1F9DD "
    ),
    "EMOJI_MODIFIER": "1F3FB-1F3FF",
    "LETTER_EMOJI": "2139 24C2 1F170-1F171 1F17E-1F17F",
}
