"""Colour normalisation used by the option reward.

``normalize_color`` returns the first entry of ``COLOR_SET`` (in list order) found in its argument, or the
argument unchanged. For a string that is a substring test ('dark grey' -> 'dark', 'standard' -> 'tan'); for a
tuple (the synthetic goals' ``(name, value)`` pairs) Python's ``in`` tests element equality, so only a value
that *is* a colour is replaced. Both quirks are the original's and change rewards, so they are kept.
"""

from __future__ import annotations

from typing import Any

# The original's list, in its order (order decides which colour wins).
COLOR_SET: tuple[str, ...] = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
    "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
    "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
    "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
    "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)  # fmt: skip


def normalize_color(value: Any) -> Any:
    """First colour of COLOR_SET contained in ``value`` (substring for str, element for tuple), else ``value``."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value
