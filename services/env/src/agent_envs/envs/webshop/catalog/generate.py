"""Generate a synthetic WebShop catalog in the original raw format, for users without the original files.

What it writes (into ``out_dir``; the same three files the original WebShop reads, same keys and shapes):

``items_shuffle.json``
    A JSON array of raw product records, one per line: ``asin`` ("B0" + 8 upper-case letters/digits),
    ``name``, ``full_description``, ``small_description`` (bullet list), ``pricing`` ("$24.49", a range
    "$24.49 - $39.99", "$1,234.50" above a thousand, rarely ""), ``customization_options`` (group name ->
    [{"value", "image"}], or ``{}`` / ``null``), ``images``, ``category`` (one of :data:`CATEGORIES`),
    ``query`` (the search query the product was "scraped" with), ``product_category`` (an Amazon-like
    breadcrumb joined with " › ") and ``average_rating``.
``items_ins_v2.json``
    ``{asin: {"attributes": [...], "instruction": "i need a ...", "instruction_attributes": [...]}}`` for
    every valid product: most have a synthetic instruction (lower case, no trailing period, its
    ``instruction_attributes`` a non-empty subset of ``attributes``), some only attributes, a few ``{}``
    (the loader then uses ``DUMMY_ATTR``).
``items_human_ins.json``
    ``{asin: [{"instruction", "instruction_attributes", "instruction_options", "asin", "assignment_id",
    "worker_id"}]}`` for a subset of products. ``instruction_options`` are option values of that product as
    the loader cleans them (lower case, "/" shown as " | "); some instructions name no attribute (the
    original skips those when it builds human goals); some end with a period.

The catalog deliberately holds the hard cases of the raw format: range prices, prices of 980 dollars and
more (no goal price ceiling; thousands written with a comma), empty pricing (the loader's $100 default),
products without options (both ``{}`` and ``null``), an option group whose contents are ``null``, option
values repeated across groups ("small" as a size and as a style), "/" in values ("black/white" ->
"black | white"), multi-word colours, mixed-case and space-padded raw values, empty and whitespace-only
bullets, a bullet text given as a plain string instead of a list, double quotes in values (52"w x 84"l), a
few duplicate ASIN records and a few invalid ASINs ("nan", longer than 10 characters) which the loader
skips. Every one of them appears within the first 200 records (see ``_FORCED``), so small catalogs exercise
them too; after that they occur at realistic rates.

Determinism: one ``random.Random(seed)`` stream drives everything and nothing depends on the requested
size except where generation stops, so the same seed gives byte-identical files, and a smaller catalog is a
prefix of a larger one with the same seed. ``products`` counts raw records (duplicates and invalid ASINs
included), as the original's ``num_products`` does.

Format: compact JSON (orjson), UTF-8, one record (or one ``"asin": value`` member) per line; any JSON
reader, and the streaming reader in ``catalog.raw``, reads it.

Scale: the three files are written as a stream, record by record (nothing but a short ring buffer of recent
records is held), under temporary names renamed at the end. Measured for 1.2M products (about the original's
size) on 2 CPU cores: 45-55 s (22k-27k products/s), peak RSS about 30 MB, 1.39 GB + 221 MB + 29 MB of files.
Each product's option groups are trimmed to at most ``MAX_OPTION_COMBINATIONS`` combinations, because the
original makes one synthetic goal per combination (about 9.4 per instructed product on average).
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from random import Random
from typing import Any, BinaryIO

import orjson
from tqdm import tqdm

PRODUCT_FILE = "items_shuffle.json"
ATTRIBUTE_FILE = "items_ins_v2.json"
HUMAN_FILE = "items_human_ins.json"

CATEGORIES = ("beauty", "electronics", "fashion", "grocery", "home")
BREADCRUMB_SEPARATOR = " › "
IMAGE_HOST = "https://example.invalid"

# Rates after the forced showcase records (per raw record / per valid product).
RATE_DUPLICATE = 0.002
RATE_NAN_ASIN = 0.0005
RATE_LONG_ASIN = 0.0005
RATE_EMPTY_OPTIONS = 0.12
RATE_NULL_OPTIONS = 0.05
RATE_NULL_GROUP = 0.01
RATE_RANGE_PRICE = 0.12
RATE_EXPENSIVE = 0.01
RATE_EMPTY_PRICE = 0.003
RATE_STRING_BULLETS = 0.01
RATE_EMPTY_BULLET = 0.08
RATE_BLANK_BULLET = 0.02
RATE_EMPTY_DESCRIPTION = 0.05
RATE_SYNTHETIC = 0.85
RATE_ATTRIBUTES_ONLY = 0.10  # the rest of the valid products get an empty entry
RATE_HUMAN = 0.06
RATE_HUMAN_NO_ATTRIBUTE = 0.06
RATE_TITLE_CASE_VALUES = 0.4
RATE_PADDED_VALUE = 0.02
RATE_REPEATED_STYLE = 0.04
MAX_OPTION_COMBINATIONS = 48  # keeps the synthetic goal count (one goal per combination) reasonable

_BATCH = 2000  # records per write / progress update

# --------------------------------------------------------------------------------------------- vocabulary

# fmt: off
# option pool key -> (raw group name, values, values carry an image)
_OPTION_POOLS: dict[str, tuple[str, tuple[str, ...], bool]] = {
    "color": (
        "color",
        (
            "black", "white", "navy blue", "dark grey", "light grey", "grey", "red", "wine red", "burgundy",
            "pink", "hot pink", "purple", "beige", "khaki", "brown", "coffee", "olive green", "army green",
            "green", "sky blue", "light blue", "blue", "royal blue", "yellow", "orange", "gold", "rose gold",
            "silver", "multicolor", "black/white", "white/black", "grey/black", "navy/white", "black/red",
            "clear", "ivory", "charcoal", "espresso", "walnut", "natural",
        ),
        True,
    ),
    "shade": (
        "color",
        (
            "01 classic red", "02 nude", "03 berry", "04 coral", "05 mauve", "06 plum/wine", "07 soft pink",
            "08 cocoa brown", "09 matte black", "10 rose gold",
        ),
        True,
    ),
    "shoe_size": (
        "size",
        (
            "5", "5.5", "6", "6.5", "7", "7.5", "8", "8.5", "9", "9.5", "10", "10.5", "11", "12", "13",
            "7 wide", "8 wide", "9.5 wide", "10 x-wide",
        ),
        False,
    ),
    "apparel_size": (
        "size",
        (
            "xx-small", "x-small", "small", "medium", "large", "x-large", "xx-large", "3x-large",
            "4x-large", "plus size",
        ),
        False,
    ),
    "kids_size": ("size", ("2t", "3t", "4t", "5", "6", "7-8", "10-12", "14-16"), False),
    "fit_type": ("fit type", ("men", "women", "youth"), False),
    "liquid_size": (
        "size",
        (
            "0.5 fl oz", "1 fl oz (pack of 1)", "1.7 fl oz", "3.4 fl oz", "8 fl oz (pack of 2)",
            "16.9 fl oz", "33.8 fl oz",
        ),
        False,
    ),
    "scent": (
        "scent",
        ("lavender", "unscented", "coconut", "eucalyptus/mint", "vanilla", "fresh linen", "rose", "citrus"),
        False,
    ),
    "hair_length": (
        "stretched length",
        ("14 inch", "16 inch", "18 inch", "20 inch", "22 inch", "24 inch", "26 inch"),
        False,
    ),
    "package": ("item package quantity", ("1", "2", "3", "4", "6", "12"), False),
    "style_electronics": (
        "style",
        ("basic", "pro", "with alexa", "without alexa", "bundle", "2022 version", "2023 version"),
        False,
    ),
    "style": (
        "style",
        ("small", "medium", "large", "classic", "modern", "1-pack", "2-pack", "modern/contemporary"),
        False,
    ),
    "tv_size": ("size", ("32 inch", "43 inch", "50 inch", "55 inch", "65 inch", "75 inch", "85 inch"), False),
    "capacity": ("capacity", ("64gb", "128gb", "256gb", "512gb", "1tb", "2tb", "4tb", "5tb"), False),
    "configuration": (
        "configuration", ("8gb ram/256gb ssd", "16gb ram/512gb ssd", "32gb ram/1tb ssd"), False
    ),
    "cable_length": ("size", ("3 feet", "6 feet", "10 feet", "15 feet", "3ft/6ft"), False),
    "pattern": (
        "pattern name", ("speaker", "speaker + mount", "speaker/subwoofer", "speaker + cable"), False
    ),
    "flavor": (
        "flavor name",
        (
            "original", "sea salt", "dark chocolate", "vanilla", "salted caramel", "cookies & cream",
            "variety pack", "peanut butter", "honey bbq", "mixed berry", "chocolate chip", "teriyaki",
        ),
        False,
    ),
    "coffee_flavor": (
        "flavor name",
        (
            "medium roast", "dark roast", "french vanilla", "hazelnut", "decaf", "breakfast blend",
            "variety pack",
        ),
        False,
    ),
    "tea_flavor": (
        "flavor name",
        ("chamomile", "peppermint", "green tea", "ginger/lemon", "earl grey", "hibiscus", "variety pack"),
        False,
    ),
    "food_size": (
        "size",
        (
            "1.5 ounce (pack of 12)", "2 ounce (pack of 6)", "12 ounce (pack of 1)", "16 ounce (pack of 2)",
            "1 pound", "2 pound (pack of 1)", "24 count", "variety pack",
        ),
        False,
    ),
    "weight": ("size", ("2.5 ounce", "4 ounce", "8 ounce", "16 ounce", "1 pound", "5 pound"), False),
    "bed_size": ("size", ("twin", "twin xl", "full", "queen", "king", "california king"), False),
    "desk_size": ("size", ("40 inch", "47 inch", "55 inch", "63 inch"), False),
    "curtain_size": ("size", ('42"w x 63"l', '52"w x 84"l', '52"w x 95"l', '100"w x 84"l'), False),
    "rug_size": (
        "size",
        ("2' x 3'", "3' x 5'", "5' x 7'", "6' x 9'", "8' x 10'", "9' x 12'", "2'3\" x 8' runner"),
        False,
    ),
    "chain_length": ("size", ("16 inch", "18 inch", "20 inch", "22 inch"), False),
    "tiers": ("size", ("3-tier", "4-tier", "5-tier", "6-tier"), False),
    "material": ("material", ("fabric", "velvet", "pu leather", "linen", "solid wood", "metal"), False),
}

# category -> (materials, uses, category-wide attributes)
_CATEGORY_VOCABULARY: dict[str, tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = {
    "beauty": (
        (
            "natural oils", "shea butter", "aloe vera", "vitamin e", "argan oil", "hyaluronic acid",
            "coconut oil",
        ),
        ("daily use", "travel", "dry skin", "sensitive skin", "all hair types", "gifting", "the gym"),
        ("high quality", "easy use", "cruelty free", "long lasting", "travel size"),
    ),
    "electronics": (
        ("aluminum alloy", "abs plastic", "tempered glass", "silicone", "braided nylon", "stainless steel"),
        ("the home office", "gaming", "travel", "the living room", "video calls", "outdoor use", "students"),
        ("high quality", "easy use", "plug play", "easy install", "long lasting", "high speed"),
    ),
    "fashion": (
        ("cotton", "polyester", "spandex", "leather", "faux suede", "mesh", "fleece", "nylon"),
        ("running", "workouts", "casual wear", "daily wear", "travel", "the office", "parties", "hiking"),
        ("quality materials", "machine wash", "comfortable fit", "high quality", "easy care"),
    ),
    "grocery": (
        ("whole grain oats", "cane sugar", "sea salt", "cocoa", "almonds", "arabica beans", "real fruit"),
        ("breakfast", "snacking", "parties", "the office", "camping", "lunch boxes", "road trips"),
        ("gluten free", "non gmo", "natural ingredients", "great gift", "kosher certified"),
    ),
    "home": (
        ("solid wood", "engineered wood", "metal", "velvet", "linen", "polyester", "microfiber"),
        (
            "the living room", "the bedroom", "small spaces", "the dining room", "apartments",
            "the home office",
        ),
        ("easy clean", "easy assemble", "high quality", "living room", "space saving"),
    ),
}

# category -> kinds: (noun, title prefix, breadcrumb, queries, option pools, (price low, high), attributes)
_Strings = tuple[str, ...]
_Kind = tuple[str, str, _Strings, _Strings, _Strings, tuple[float, float], _Strings]
_FASHION = "Clothing, Shoes & Jewelry"
_BEAUTY = "Beauty & Personal Care"
_GROCERY = "Grocery & Gourmet Food"
_HOME = "Home & Kitchen"
_KINDS: dict[str, tuple[_Kind, ...]] = {
    "fashion": (
        ("running shoes", "Men's ", (_FASHION, "Men", "Shoes", "Athletic", "Running"),
         ("men's running shoes", "men's athletic shoes"), ("color", "shoe_size"), (25, 160),
         ("rubber sole", "lace closure", "non slip", "memory foam", "arch support", "breathable mesh")),
        ("ankle boots", "Women's ", (_FASHION, "Women", "Shoes", "Boots", "Ankle & Bootie"),
         ("women's ankle boots", "women's boots"), ("color", "shoe_size"), (30, 220),
         ("rubber sole", "zipper closure", "faux fur", "anti slip", "leather upper", "high heel")),
        ("t-shirt", "Men's ", (_FASHION, "Men", "Clothing", "Shirts", "T-Shirts"),
         ("men's t-shirts", "men's tops"), ("color", "apparel_size", "fit_type"), (8, 45),
         ("short sleeve", "cotton spandex", "classic fit", "relaxed fit", "crew neck")),
        ("leggings", "Women's ", (_FASHION, "Women", "Clothing", "Active", "Active Pants", "Leggings"),
         ("women's leggings", "yoga pants for women"), ("color", "apparel_size"), (12, 70),
         ("high waist", "tummy control", "moisture wicking", "four way stretch", "hand wash",
          "elastic waistband")),
        ("casual dress", "Women's ", (_FASHION, "Women", "Clothing", "Dresses", "Casual"),
         ("women's dresses", "summer dresses for women"), ("color", "apparel_size"), (18, 120),
         ("short sleeve", "long sleeve", "polyester spandex", "loose fit", "button closure")),
        ("down jacket", "Men's ", (_FASHION, "Men", "Clothing", "Jackets & Coats", "Down & Parkas"),
         ("men's winter jackets", "men's coats"), ("color", "apparel_size"), (45, 400),
         ("zipper closure", "water resistant", "long sleeve", "fleece lined", "windproof")),
        ("bikini set", "Women's ", (_FASHION, "Women", "Clothing", "Swimsuits & Cover Ups", "Bikinis"),
         ("women's swimsuits", "bikini sets"), ("color", "apparel_size"), (15, 60),
         ("tummy control", "hand wash", "quick drying", "adjustable straps", "high waist")),
        ("dress", "Girls' ", (_FASHION, "Girls", "Clothing", "Dresses"),
         ("girls dresses", "toddler girl dresses"), ("color", "kids_size"), (10, 50),
         ("cotton blend", "button closure", "cute design", "short sleeve")),
        ("pendant necklace", "Women's ", (_FASHION, "Women", "Jewelry", "Necklaces", "Pendants"),
         ("women's necklaces", "pendant necklaces"), ("color", "chain_length"), (9, 250),
         ("sterling silver", "gold plated", "hypoallergenic", "gift box", "adjustable chain")),
        ("slippers", "Men's ", (_FASHION, "Men", "Shoes", "Slippers"),
         ("men's slippers", "house slippers"), ("color", "shoe_size"), (12, 60),
         ("memory foam", "non slip", "faux fur", "rubber sole", "machine washable")),
    ),
    "beauty": (
        ("shampoo", "", (_BEAUTY, "Hair Care", "Shampoo & Conditioner", "Shampoos"),
         ("shampoo", "sulfate free shampoo"), ("liquid_size", "scent"), (6, 60),
         ("sulfate free", "paraben free", "hair growth", "dry hair", "natural ingredients", "color treated")),
        ("face moisturizer", "", (_BEAUTY, "Skin Care", "Face", "Creams & Moisturizers", "Face Moisturizers"),
         ("face moisturizer", "anti aging cream"), ("liquid_size",), (9, 120),
         ("fine lines", "dry skin", "sensitive skin", "hyaluronic acid", "anti aging")),
        ("lipstick", "", (_BEAUTY, "Makeup", "Lips", "Lipstick"),
         ("lipstick", "matte lipstick"), ("shade",), (5, 40),
         ("long lasting", "highly pigmented", "easy apply", "paraben free", "matte finish")),
        ("eau de parfum", "Women's ", (_BEAUTY, "Fragrance", "Women's", "Eau de Parfum"),
         ("perfume for women", "women's fragrance"), ("liquid_size",), (15, 180),
         ("long lasting", "gift set", "fresh scent", "floral scent")),
        ("nail polish", "", (_BEAUTY, "Foot, Hand & Nail Care", "Nail Art & Polish", "Nail Polish"),
         ("nail polish", "gel nail polish"), ("shade", "package"), (4, 35),
         ("long lasting", "easy apply", "non toxic", "quick dry", "high gloss")),
        ("makeup brush set", "", (_BEAUTY, "Tools & Accessories", "Makeup Brushes & Tools", "Brush Sets"),
         ("makeup brushes", "makeup brush set"), ("color",), (7, 60),
         ("synthetic hair", "easy clean", "travel case", "soft bristles")),
        ("lace front wig", "", (_BEAUTY, "Hair Care", "Hair Extensions, Wigs & Accessories", "Wigs"),
         ("lace front wigs", "human hair wigs"), ("color", "hair_length"), (25, 300),
         ("natural looking", "human hair", "heat resistant", "easy wear")),
        ("electric toothbrush", "",
         (_BEAUTY, "Oral Care", "Toothbrushes & Accessories", "Electric Toothbrushes"),
         ("electric toothbrush", "sonic toothbrush"), ("color", "package"), (18, 150),
         ("fast charging", "travel case", "sensitive teeth", "soft bristles")),
        ("body wash", "", (_BEAUTY, "Personal Care", "Bath & Bathing Accessories", "Bath", "Body Washes"),
         ("body wash", "shower gel"), ("scent", "liquid_size", "package"), (4, 35),
         ("natural ingredients", "dry skin", "sensitive skin", "paraben free")),
    ),
    "electronics": (
        ("wireless mouse", "", ("Electronics", "Computers & Accessories",
                                "Computer Accessories & Peripherals",
                                "Keyboards, Mice & Accessories", "Mice"),
         ("wireless mouse", "computer mouse"), ("color", "style_electronics"), (8, 120),
         ("wireless bluetooth", "usb receiver", "ergonomic design", "silent click")),
        ("over-ear headphones", "", ("Electronics", "Headphones, Earbuds & Accessories", "Headphones",
                                     "Over-Ear Headphones"),
         ("bluetooth headphones", "noise cancelling headphones"), ("color", "style_electronics"), (20, 400),
         ("noise cancelling", "wireless bluetooth", "hands free", "carrying case", "stereo sound")),
        ("usb c charger", "", ("Cell Phones & Accessories", "Accessories", "Chargers & Power Adapters",
                               "Wall Chargers"),
         ("usb c charger", "fast charger"), ("color", "package"), (9, 60),
         ("fast charging", "usb port", "compact design", "overheat protection")),
        ("smart tv", "", ("Electronics", "Television & Video", "Televisions"),
         ("smart tv", "4k tv"), ("tv_size", "style_electronics"), (150, 2600),
         ("4k ultra hd", "high definition", "wall mount", "dolby vision", "remote control")),
        ("camera tripod", "", ("Electronics", "Camera & Photo", "Tripods & Monopods", "Complete Tripods"),
         ("camera tripod", "phone tripod"), ("color",), (15, 200),
         ("aluminum alloy", "easy carry", "quick release", "carrying case", "lightweight")),
        ("bluetooth speaker", "", ("Electronics", "Portable Audio & Video", "Portable Speakers & Docks",
                                   "Portable Bluetooth Speakers"),
         ("bluetooth speaker", "portable speaker"), ("color",), (15, 300),
         ("wireless bluetooth", "water resistant", "stereo sound", "hands free")),
        ("external hard drive", "", ("Electronics", "Computers & Accessories", "Data Storage",
                                     "External Hard Drives"),
         ("external hard drive", "portable ssd"), ("capacity", "color"), (45, 500),
         ("usb port", "easy carry", "shock resistant")),
        ("hdmi cable", "", ("Electronics", "Computers & Accessories", "Computer Accessories & Peripherals",
                            "Cables & Accessories", "Cables & Interconnects", "HDMI Cables"),
         ("hdmi cable", "4k hdmi cable"), ("cable_length", "package"), (5, 40),
         ("gold plated", "4k ultra hd", "braided cable")),
        ("sound bar", "", ("Electronics", "Home Audio", "Home Theater Systems", "Sound Bars"),
         ("sound bar", "home theater system"), ("pattern", "style"), (60, 1500),
         ("wall mount", "wireless bluetooth", "stereo sound", "remote control")),
        ("laptop", "", ("Electronics", "Computers & Accessories", "Computers & Tablets", "Laptops",
                        "Traditional Laptops"),
         ("laptop", "gaming laptop"), ("configuration", "color"), (300, 3200),
         ("high performance", "fast charging", "quad core", "backlit keyboard", "full hd")),
    ),
    "grocery": (
        ("cookies", "", (_GROCERY, "Snacks & Sweets", "Cookies"),
         ("gluten free cookies", "cookies"), ("flavor", "food_size"), (4, 45),
         ("individually wrapped", "sugar free", "soft baked")),
        ("ground coffee", "", (_GROCERY, "Beverages", "Coffee, Tea & Cocoa", "Coffee", "Ground Coffee"),
         ("ground coffee", "organic coffee"), ("coffee_flavor", "food_size"), (7, 60),
         ("usda organic", "fair trade", "dark roast", "rich flavor")),
        ("seasoning", "",
         (_GROCERY, "Pantry Staples", "Herbs, Spices & Seasonings", "Mixed Spices & Seasonings"),
         ("seasoning", "spices"), ("weight",), (3, 30),
         ("low sodium", "no msg", "all natural")),
        ("dark chocolate", "", (_GROCERY, "Snacks & Sweets", "Chocolate", "Chocolate Bars"),
         ("dark chocolate", "sugar free chocolate"), ("flavor", "food_size"), (4, 55),
         ("sugar free", "keto friendly", "dairy free", "individually wrapped")),
        ("energy drink", "",
         (_GROCERY, "Beverages", "Bottled Beverages, Water & Drink Mixes", "Energy Drinks"),
         ("energy drinks", "sugar free energy drink"), ("flavor", "food_size"), (15, 60),
         ("sugar free", "zero sugar", "low calorie", "natural flavors", "keto friendly")),
        ("granola cereal", "", (_GROCERY, "Breakfast Foods", "Cereals", "Cold Cereals"),
         ("breakfast cereal", "granola"), ("flavor", "food_size"), (4, 40),
         ("high protein", "whole grain", "low sugar", "plant based")),
        ("beef jerky", "", (_GROCERY, "Snacks & Sweets", "Snack Foods", "Jerky & Dried Meats", "Jerky"),
         ("beef jerky", "jerky"), ("flavor", "food_size"), (6, 55),
         ("high protein", "low carb", "keto friendly", "individually wrapped")),
        ("protein bars", "", (_GROCERY, "Snacks & Sweets", "Snack Foods", "Bars", "Protein Bars"),
         ("protein bars", "keto snacks"), ("flavor", "package"), (8, 45),
         ("high protein", "low carb", "plant based", "individually wrapped")),
        ("herbal tea", "", (_GROCERY, "Beverages", "Coffee, Tea & Cocoa", "Tea", "Herbal"),
         ("herbal tea", "green tea"), ("tea_flavor", "package"), (4, 35),
         ("caffeine free", "usda organic", "individually wrapped")),
    ),
    "home": (
        ("sofa", "", (_HOME, "Furniture", "Living Room Furniture", "Sofas & Couches"),
         ("living room sofa", "sectional sofa"), ("color", "material"), (180, 2800),
         ("solid wood", "high density", "wood frame", "metal legs", "mid century")),
        ("platform bed frame", "", (_HOME, "Furniture", "Bedroom Furniture", "Beds, Frames & Bases", "Beds"),
         ("bed frame", "platform bed"), ("color", "bed_size"), (90, 1600),
         ("storage space", "solid wood", "box spring", "metal frame", "noise free")),
        ("computer desk", "", (_HOME, "Furniture", "Home Office Furniture", "Home Office Desks"),
         ("computer desk", "office desk"), ("color", "desk_size", "style"), (60, 900),
         ("storage space", "metal legs", "engineered wood", "home office")),
        ("blackout curtains", "", (_HOME, "Home Décor", "Window Treatments", "Curtains & Drapes", "Panels"),
         ("blackout curtains", "living room curtains"), ("color", "curtain_size"), (12, 90),
         ("machine washable", "thermal insulated", "easy install", "room darkening")),
        ("sheet set", "", (_HOME, "Bedding", "Sheets & Pillowcases", "Sheet & Pillowcase Sets"),
         ("bed sheets", "queen sheet set"), ("color", "bed_size"), (18, 160),
         ("machine washable", "deep pocket", "wrinkle free", "super soft")),
        ("dining chairs", "", (_HOME, "Furniture", "Kitchen & Dining Room Furniture", "Chairs"),
         ("dining chairs", "kitchen chairs"), ("color", "package"), (40, 700),
         ("metal legs", "mid century", "solid wood", "dining room", "pu leather")),
        ("area rug", "", (_HOME, "Home Décor", "Area Rugs, Runners & Pads", "Area Rugs"),
         ("area rug", "living room rug"), ("color", "rug_size"), (25, 1100),
         ("non slip", "machine washable", "non shedding", "stain resistant")),
        ("table lamp", "",
         ("Tools & Home Improvement", "Lighting & Ceiling Fans", "Lamps & Shades", "Table Lamps"),
         ("table lamp", "bedside lamp"), ("color", "style"), (15, 200),
         ("easy install", "usb port", "dimmable light", "energy saving")),
        ("bookshelf", "", (_HOME, "Furniture", "Home Office Furniture", "Bookcases"),
         ("bookshelf", "storage shelf"), ("color", "tiers"), (35, 500),
         ("storage space", "engineered wood", "metal frame")),
    ),
}

_BRAND_HEADS = (
    "Lum", "Nov", "Ver", "Orb", "Zen", "Kai", "Bel", "Tru", "Aur", "Sol", "Mar", "Pix", "Vel", "Cor", "Dex",
    "Fio", "Hal", "Ner", "Qui", "Ros", "Tam", "Ulv", "Wen", "Yar",
)
_BRAND_TAILS = ("ora", "ix", "tex", "ana", "o", "ly", "wave", "craft", "nest", "field", "lane", "vue")
_BRANDS = tuple(head + tail for head in _BRAND_HEADS for tail in _BRAND_TAILS)
_ADJECTIVES = (
    "Premium", "Classic", "Lightweight", "Soft", "Modern", "Vintage", "Deluxe", "Compact", "Ultra",
    "Everyday", "Essential", "Original", "Pro", "Slim", "Heavy Duty", "Upgraded",
)
_TITLE_TEMPLATES = (
    "{brand} {prefix}{adj} {noun} - {a1}, {a2}",
    "{brand} {prefix}{noun} for {use}, {a1} {material} {noun_last}",
    "{prefix}{adj} {noun} by {brand} | {a1} & {a2}",
    "{brand} {adj} {noun}, {a1} {noun_last} for {use}",
    "{brand} {prefix}{noun} ({a1})",
)
_DESCRIPTION_SENTENCES = (
    "The {brand} {noun} is made of {material} and built for {use}.",
    "{a1_cap} and {a2} - everything you want from {article_noun}.",
    "Our {noun} {be} {a1}, so {it} stays with you from {use} to {use2}.",
    "Designed in-house by {brand}, tested for {use}.",
    "What you get: 1 x {noun}, a quick-start card and our 30-day satisfaction promise.",
    "Note: colors may look slightly different on screen. Please check the size chart before ordering.",
)
_BULLET_TEMPLATES = (
    "{a1_upper}: {a1} {noun} made with {material}",
    "PERFECT FOR {use_upper}: {adj_lower} {noun} for {use}",
    "{a2_upper} - made with {material}",
    "WHAT YOU GET: {brand} {noun}, {pack}",
    "Care: wipe clean or follow the label; do not bleach",
    "{a1} | {a2} | {material}",
)
_PACKS = ("1 pack", "2 pack", "set of 4", "pack of 6", "single unit", "gift box included")
# "{article}" becomes "a"/"an" by the next word, or nothing before plural and mass nouns; "{be}" is/are.
_SYNTHETIC_TEMPLATES = (
    "i need {article} {phrase} {noun}",
    "i am looking for {article} {noun} that {be} {phrase}",
    "i want {article} {phrase} {noun}",
    "i need {article} {noun} that {be} {phrase}",
    "i am looking for {article} {phrase} {noun} for {use}",
    "i want to buy {article} {noun} which {be} {phrase}",
    "i am looking for {phrase} {noun}",
)
_HUMAN_TEMPLATES = (
    "i am looking for {article} {phrase} {noun}{options_in}",
    "i would like {article} {noun} that {be} {phrase}{options_in}",
    "can you find me {article} {phrase} {noun}{options_in}? it's for {use}",
    "please find {article} {noun}{options_in}. it should be {phrase}",
    "i need {article} {phrase} {noun}{options_in} for {use}",
    "i want {article} {noun}{options_in} that {be} {phrase}",
    "looking for {article} {phrase} {noun}{options_in} at a good price",
)
_HUMAN_TEMPLATES_NO_ATTRIBUTE = (
    "i am looking for {article} {noun}{options_in}",
    "i want {article} {noun}{options_in}",
    "get me {article} {noun}{options_in}",
)
# How an option value is named in a human instruction, by group ("{v} <group>" otherwise).
_OPTION_PHRASES = {
    "color": "{v}",
    "size": "size {v}",
    "flavor name": "{v} flavor",
    "scent": "{v} scent",
    "style": "the {v} style",
    "fit type": "the {v} fit",
    "item package quantity": "a pack of {v}",
    "pattern name": "the {v} pattern",
    "configuration": "the {v} configuration",
    "material": "{v}",
}
_PLURAL_NOUNS = frozenset(
    {"running shoes", "ankle boots", "leggings", "slippers", "over-ear headphones", "cookies",
     "protein bars", "blackout curtains", "dining chairs"}
)  # fmt: skip
_MASS_NOUNS = frozenset(
    {"shampoo", "eau de parfum", "nail polish", "body wash", "ground coffee", "seasoning", "dark chocolate",
     "granola cereal", "beef jerky", "herbal tea"}
)  # fmt: skip
# fmt: on
_ALNUM = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_ASIN_SPACE = 36**8
_ASIN_MULTIPLIER = 1_853_020_188_851  # coprime with 36**8, so index -> ASIN is one-to-one

# Showcase records: raw index -> the hard cases forced on it (so that small catalogs hold every one).
_FORCED: dict[int, frozenset[str]] = {
    index: frozenset(features)
    for index, features in {
        1: {"slash_color", "repeated_value", "human", "synthetic"},
        3: {"empty_options", "human", "synthetic"},
        5: {"null_options", "synthetic"},
        7: {"range_price", "empty_bullet", "blank_bullet", "human", "synthetic"},
        9: {"expensive", "multi_word_color", "synthetic", "human"},
        11: {"expensive_comma", "attributes_only"},
        13: {"nan_asin"},
        15: {"null_group", "padded_value", "title_case", "synthetic"},
        17: {"string_bullets", "empty_price", "empty_entry"},
        19: {"duplicate"},
        21: {"long_asin"},
        23: {"human_no_attribute", "human", "synthetic"},
        25: {"quoted_value", "human", "synthetic"},
        27: {"empty_description", "multi_word_color", "human"},
        29: {"repeated_value", "range_price", "title_case", "synthetic"},
        31: {"slash_color", "human", "synthetic", "human_no_attribute"},
        41: {"duplicate"},
        77: {"nan_asin"},
        97: {"long_asin"},
        133: {"duplicate"},
    }.items()
}
_FORCED_CATEGORY = {
    1: "fashion",
    9: "home",
    11: "electronics",
    15: "beauty",
    25: "home",
    27: "fashion",
    31: "fashion",
}


# --------------------------------------------------------------------------------------------- generator


def generate_catalog(out_dir: Path, products: int, seed: int = 0, progress: bool = True) -> dict[str, Any]:
    """Write a deterministic synthetic catalog of ``products`` raw records into ``out_dir``.

    The files are written under temporary names and renamed at the end, so an interrupted run never leaves
    files that look complete. Returns a summary: counts, file sizes, seed and time taken.
    """
    if products < 0:
        raise ValueError(f"products must be >= 0, got {products}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    names = (PRODUCT_FILE, ATTRIBUTE_FILE, HUMAN_FILE)
    temporary = {name: out_dir / f".{name}.tmp" for name in names}
    started = time.perf_counter()
    generator = _Generator(seed)
    dumps = orjson.dumps
    try:
        with ExitStack() as stack:
            writers = {
                name: _StreamWriter(stack.enter_context(open(temporary[name], "wb")), opening)
                for name, opening in zip(names, (b"[", b"{", b"{"), strict=True)
            }
            bar = stack.enter_context(
                tqdm(
                    total=products,
                    unit="product",
                    unit_scale=True,
                    desc="generate catalog",
                    disable=not progress,
                )
            )
            for start in range(0, products, _BATCH):
                stop = min(products, start + _BATCH)
                product_lines, attribute_lines, human_lines = [], [], []
                for record, entry, human in generator.records(start, stop):
                    product_lines.append(dumps(record))
                    if entry is not None:  # None for duplicate and invalid records
                        key = dumps(record["asin"]) + b": "
                        attribute_lines.append(key + dumps(entry))
                        if human is not None:
                            human_lines.append(key + dumps(human))
                writers[PRODUCT_FILE].write(product_lines)
                writers[ATTRIBUTE_FILE].write(attribute_lines)
                writers[HUMAN_FILE].write(human_lines)
                bar.update(stop - start)
            for writer in writers.values():
                writer.close()
        for name in names:
            os.replace(temporary[name], out_dir / name)
    finally:
        for path in temporary.values():
            path.unlink(missing_ok=True)
    return {
        "out_dir": str(out_dir),
        "seed": seed,
        "products": products,
        **generator.counts,
        "files": {name: (out_dir / name).stat().st_size for name in names},
        "seconds": round(time.perf_counter() - started, 3),
    }


class _StreamWriter:
    """Writes a JSON array or object one element per line, without holding the elements."""

    def __init__(self, handle: BinaryIO, opening: bytes) -> None:
        self.handle = handle
        self.closing = b"]" if opening == b"[" else b"}"
        self.empty = True
        handle.write(opening)

    def write(self, elements: list[bytes]) -> None:
        if elements:
            self.handle.write((b"\n" if self.empty else b",\n") + b",\n".join(elements))
            self.empty = False

    def close(self) -> None:
        self.handle.write((self.closing if self.empty else b"\n" + self.closing) + b"\n")


class _Generator:
    """Produces raw records in order from one seeded random stream.

    Draws use ``random()`` directly (``seq[int(random() * len(seq))]`` and a partial Fisher-Yates shuffle)
    rather than ``Random.choice``/``sample``: same determinism, several times faster, which is what makes
    1.2M products a matter of a minute.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self.rng = Random(seed)
        self.random = self.rng.random
        self.asin_offset = Random(f"webshop-asin-{seed}").randrange(_ASIN_SPACE)
        self.recent: deque[dict[str, Any]] = deque(maxlen=64)
        self.counts = {
            "valid_products": 0,
            "duplicate_records": 0,
            "invalid_asin_records": 0,
            "synthetic_instructions": 0,
            "attribute_entries": 0,
            "human_products": 0,
            "human_instructions": 0,
            "products_without_options": 0,
            "synthetic_goal_combinations": 0,
        }

    # ----------------------------------------------------------------------------------------- draws

    def pick(self, seq: Any) -> Any:
        return seq[int(self.random() * len(seq))]

    def between(self, low: int, high: int) -> int:
        """An integer in [low, high], both included."""
        return low + int(self.random() * (high - low + 1))

    def some(self, seq: Any, count: int) -> list[Any]:
        """``count`` distinct elements in random order (partial Fisher-Yates)."""
        pool = list(seq)
        random = self.random
        size = len(pool)
        count = min(count, size)
        for i in range(count):
            j = i + int(random() * (size - i))
            pool[i], pool[j] = pool[j], pool[i]
        return pool[:count]

    def code(self, count: int) -> str:
        random = self.random
        return "".join([_ALNUM[int(random() * 36)] for _ in range(count)])

    # ----------------------------------------------------------------------------------------- records

    def records(
        self, start: int, stop: int
    ) -> Iterator[tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]] | None]]:
        """Yield (raw product, items_ins_v2 entry or None, human instructions or None) for each index."""
        random = self.random
        for index in range(start, stop):
            forced = _FORCED.get(index)
            draw = random()
            if (forced and "duplicate" in forced) or (
                forced is None and draw < RATE_DUPLICATE and self.recent
            ):
                self.counts["duplicate_records"] += 1
                yield self._duplicate(), None, None
                continue
            bad_asin = None
            if (forced and "nan_asin" in forced) or (forced is None and draw > 1 - RATE_NAN_ASIN):
                bad_asin = "nan"
            elif (forced and "long_asin" in forced) or (
                forced is None and 1 - RATE_NAN_ASIN - RATE_LONG_ASIN < draw <= 1 - RATE_NAN_ASIN
            ):
                bad_asin = self._asin(index) + self.code(self.between(1, 4))
            record, entry, human = self._product(index, forced or _NOTHING, bad_asin)
            if bad_asin is not None:
                self.counts["invalid_asin_records"] += 1
                yield record, None, None
                continue
            self.recent.append(record)
            yield record, entry, human

    def _asin(self, index: int) -> str:
        number = (index * _ASIN_MULTIPLIER + self.asin_offset) % _ASIN_SPACE
        high, low = divmod(number, 1296 * 1296)
        return "B0" + _PAIRS[high // 1296] + _PAIRS[high % 1296] + _PAIRS[low // 1296] + _PAIRS[low % 1296]

    def _duplicate(self) -> dict[str, Any]:
        """A later record for an ASIN already seen, scraped again under another query.

        The loader keeps the first record of an ASIN.
        """
        copy = dict(self.pick(self.recent))
        copy["query"] = self.pick(self.pick(_KINDS[copy["category"]])[3])
        copy["average_rating"] = round(2.5 + 2.5 * self.random(), 1)
        return copy

    def _product(
        self, index: int, forced: frozenset[str], bad_asin: str | None
    ) -> tuple[dict[str, Any], dict[str, Any] | None, list[dict[str, Any]] | None]:
        random = self.random
        pick = self.pick
        some = self.some
        free = not forced  # random hard cases only on records that are not showcase records
        asin = bad_asin or self._asin(index)
        category = _FORCED_CATEGORY.get(index) or pick(CATEGORIES)
        materials, uses, category_attributes = _CATEGORY_VOCABULARY[category]
        kind = _KINDS["home"][3] if "quoted_value" in forced else pick(_KINDS[category])
        noun, prefix, breadcrumb, queries, pools, (low, high), kind_attributes = kind
        brand = pick(_BRANDS)
        material = pick(materials)
        use, use2 = some(uses, 2)
        attributes = some(kind_attributes + category_attributes, self.between(2, 5))
        a1, a2 = attributes[0], attributes[1]

        # options
        if "empty_options" in forced or (free and random() < RATE_EMPTY_OPTIONS):
            raw_options: dict[str, Any] | None = {}
            cleaned: dict[str, list[str]] = {}
        elif "null_options" in forced or (free and random() < RATE_NULL_OPTIONS):
            raw_options, cleaned = None, {}
        else:
            raw_options, cleaned = self._options(pools, forced)
        if not cleaned:
            self.counts["products_without_options"] += 1

        # title, description, bullets
        noun_title = _TITLE_NOUNS[noun]
        title = pick(_TITLE_TEMPLATES).format(
            brand=brand, prefix=prefix, adj=pick(_ADJECTIVES), noun=noun_title,
            noun_last=noun_title.rsplit(" ", 1)[-1], a1=a1.title(), a2=a2.title(), use=use, material=material,
        )  # fmt: skip
        plural = noun in _PLURAL_NOUNS
        fields = {
            "brand": brand, "noun": noun, "material": material, "use": use, "use2": use2, "a1": a1, "a2": a2,
            "a1_cap": a1.capitalize(), "a1_upper": a1.upper(), "a2_upper": a2.upper(),
            "use_upper": use.upper(), "adj_lower": pick(_ADJECTIVES).lower(), "pack": pick(_PACKS),
            "be": "are" if plural else "is", "it": "they" if plural else "it",
            "article_noun": _with_article(noun),
        }  # fmt: skip
        if "empty_description" in forced or (free and random() < RATE_EMPTY_DESCRIPTION):
            description = ""
        else:
            description = " ".join(
                [t.format_map(fields) for t in some(_DESCRIPTION_SENTENCES, self.between(2, 4))]
            )
        bullets: list[str] | str = [t.format_map(fields) for t in some(_BULLET_TEMPLATES, self.between(2, 5))]
        if "empty_bullet" in forced or (free and random() < RATE_EMPTY_BULLET):
            bullets.insert(self.between(0, len(bullets)), "")
        if "blank_bullet" in forced or (free and random() < RATE_BLANK_BULLET):
            bullets.append(pick((" ", "  ", "\n", " \t ")))
        if "string_bullets" in forced or (free and random() < RATE_STRING_BULLETS):
            bullets = " ".join(bullets)

        record = {
            "asin": asin,
            "name": title,
            "full_description": description,
            "small_description": bullets,
            "pricing": self._pricing(low, high, forced, category),
            "customization_options": raw_options,
            "images": [f"{IMAGE_HOST}/images/I/{asin}-{k}.jpg" for k in range(1, self.between(2, 5))],
            "category": category,
            "query": pick(queries),
            "product_category": _BREADCRUMBS[breadcrumb],
            "average_rating": round(2.5 + 2.5 * random(), 1),
        }
        if bad_asin is not None:
            return record, None, None
        counts = self.counts
        counts["valid_products"] += 1

        # items_ins_v2 entry: synthetic instruction, attributes only, or empty
        entry: dict[str, Any] = {}
        draw = random()
        if "attributes_only" in forced or (
            free and RATE_SYNTHETIC <= draw < RATE_SYNTHETIC + RATE_ATTRIBUTES_ONLY
        ):
            entry = {"attributes": attributes}
        elif "synthetic" in forced or (free and draw < RATE_SYNTHETIC):
            wanted = some(attributes, pick((1, 1, 1, 2, 2, 3)))
            text = pick(_SYNTHETIC_TEMPLATES).format(
                phrase=_join(wanted), noun=noun, use=use, article="{article}", be="are" if plural else "is"
            )
            entry = {
                "attributes": attributes,
                "instruction": _fix_articles(text, noun),
                "instruction_attributes": wanted,
            }
            counts["synthetic_instructions"] += 1
            combinations = 1
            for values in cleaned.values():
                combinations *= len(values)
            counts["synthetic_goal_combinations"] += combinations
        counts["attribute_entries"] += 1

        # human instructions
        human = None
        if "human" in forced or (free and random() < RATE_HUMAN):
            human = [
                self._human(asin, noun, use, attributes, cleaned, forced if n == 0 else _NOTHING)
                for n in range(pick((1, 1, 1, 1, 1, 1, 1, 2, 2, 3)))
            ]
            counts["human_products"] += 1
            counts["human_instructions"] += len(human)
            if not entry:  # human instructions name attributes of the product: give it its attributes
                entry = {"attributes": attributes}
        return record, entry, human

    def _options(
        self, pools: tuple[str, ...], forced: frozenset[str]
    ) -> tuple[dict[str, list[dict[str, Any]] | None], dict[str, list[str]]]:
        """Raw option groups and, for instructions, the same values as the loader cleans them."""
        random = self.random
        free = not forced
        title_case = "title_case" in forced or (free and random() < RATE_TITLE_CASE_VALUES)
        chosen: dict[str, list[str]] = {}
        image_groups = set()
        for key in pools:
            group, values, with_image = _OPTION_POOLS[key]
            if group in chosen or (free and random() < 0.2):
                continue
            picked = sorted(self.some(range(len(values)), self.between(1, 7)))
            chosen[group] = [values[i] for i in picked]
            if with_image:
                image_groups.add(group)
        if "slash_color" in forced:
            chosen.setdefault("color", [])[:0] = ["black/white"]
            image_groups.add("color")
        if "multi_word_color" in forced:
            chosen.setdefault("color", [])[:0] = ["navy blue", "dark grey"]
            image_groups.add("color")
        if "quoted_value" in forced:
            chosen["size"] = ['52"w x 84"l', '52"w x 95"l']
        if (
            "repeated_value" in forced or (free and random() < RATE_REPEATED_STYLE)
        ) and "style" not in chosen:
            sizes = chosen.setdefault("size", [])
            if "small" not in sizes:
                sizes.insert(0, "small")
            chosen["style"] = ["small", "classic", "modern/contemporary"]
        for group, values in chosen.items():  # no value twice within a group, order kept
            chosen[group] = list(dict.fromkeys(values))
        # bound the synthetic goals of one product (one per combination): trim the largest group
        while _product_of_lengths(chosen) > MAX_OPTION_COMBINATIONS:
            max(chosen.values(), key=len).pop()
        raw: dict[str, list[dict[str, Any]] | None] = {}
        cleaned: dict[str, list[str]] = {}
        padded = "padded_value" in forced
        for group, values in chosen.items():
            entries = []
            for value in values:
                shown = value.title() if title_case else value
                if padded or (free and random() < RATE_PADDED_VALUE):
                    shown = f" {shown} "
                    padded = False
                image = _OPTION_IMAGES[value] if group in image_groups else None
                entries.append({"value": shown, "image": image})
            raw[group.title() if title_case and group != "size" else group] = entries
            cleaned[group] = [_CLEANED[v] for v in values]
        if "null_group" in forced or (free and random() < RATE_NULL_GROUP):
            raw["item shape" if "pattern name" in cleaned else "pattern name"] = None
        return raw, cleaned

    def _pricing(self, low: float, high: float, forced: frozenset[str], category: str) -> str:
        random = self.random
        free = not forced
        if "empty_price" in forced or (free and random() < RATE_EMPTY_PRICE):
            return ""
        if "expensive_comma" in forced:
            low, high = 1000.0, 4999.0
        elif "expensive" in forced:
            low, high = 980.0, 999.0
        elif free and category in ("home", "electronics") and random() < RATE_EXPENSIVE:
            low, high = 980.0, 6000.0
        price = int(low * (high / low) ** random()) + self._cents()
        if "range_price" in forced or (free and random() < RATE_RANGE_PRICE):
            upper = int(price * (1.1 + 1.4 * random())) + self._cents()
            return f"${price:,.2f} - ${upper:,.2f}"
        return f"${price:,.2f}"

    def _cents(self) -> float:
        """Cents the way shops price: mostly .99/.49/.95/.00, sometimes anything."""
        draw = self.random()
        if draw < 0.4:
            return 0.99
        if draw < 0.55:
            return 0.49
        if draw < 0.65:
            return 0.95
        if draw < 0.72:
            return 0.0
        return self.between(1, 98) / 100

    def _human(
        self,
        asin: str,
        noun: str,
        use: str,
        attributes: list[str],
        cleaned: dict[str, list[str]],
        forced: frozenset[str],
    ) -> dict[str, Any]:
        pick = self.pick
        free = not forced
        no_attribute = "human_no_attribute" in forced or (free and self.random() < RATE_HUMAN_NO_ATTRIBUTE)
        wanted = [] if no_attribute else self.some(attributes, pick((1, 1, 2, 2, 3)))
        groups = [group for group, values in cleaned.items() if values]
        picked_groups = self.some(groups, pick((0, 1, 1, 2, 2)))
        option_values = [pick(cleaned[group]) for group in picked_groups]
        options_in = ""
        if option_values:
            phrases = [
                _OPTION_PHRASES.get(group, "{v} " + group).format(v=value.replace(" | ", "/"))
                for group, value in zip(picked_groups, option_values, strict=True)
            ]
            options_in = " in " + _join(phrases)
        text = pick(_HUMAN_TEMPLATES if wanted else _HUMAN_TEMPLATES_NO_ATTRIBUTE).format(
            article="{article}", phrase=_join(wanted), noun=noun, use=use, options_in=options_in,
            be="are" if noun in _PLURAL_NOUNS else "is",
        )  # fmt: skip
        text = _fix_articles(text, noun)
        if self.random() < 0.3:
            text += "."
        return {
            "instruction": text,
            "instruction_attributes": wanted,
            "instruction_options": option_values,
            "asin": asin,
            "assignment_id": "3" + self.code(29),
            "worker_id": "A" + self.code(self.between(11, 13)),
        }


# --------------------------------------------------------------------------------------------- helpers

_NOTHING: frozenset[str] = frozenset()
_PAIRS = [a + b for a in _ALNUM for b in _ALNUM]  # base-36 digit pairs, 0 .. 1295
_TITLE_NOUNS = {kind[0]: kind[0].title() for kinds in _KINDS.values() for kind in kinds}
_BREADCRUMBS = {kind[2]: BREADCRUMB_SEPARATOR.join(kind[2]) for kinds in _KINDS.values() for kind in kinds}


def _clean_value(value: str) -> str:
    """An option value as the loader shows it (the original's rule; see catalog.raw.clean_options)."""
    return value.strip().replace("/", " | ").lower()


def _slug(value: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in value.lower()).strip("-")


_FORCED_VALUES = ("black/white", "navy blue", "dark grey", "small", "classic", "modern/contemporary",
                  '52"w x 84"l', '52"w x 95"l')  # fmt: skip
_ALL_VALUES = {value for _, values, _ in _OPTION_POOLS.values() for value in values} | set(_FORCED_VALUES)
_CLEANED = {value: _clean_value(value) for value in _ALL_VALUES}
_OPTION_IMAGES = {value: f"{IMAGE_HOST}/images/I/opt-{_slug(value)}.jpg" for value in _ALL_VALUES}


def _join(words: list[str]) -> str:
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " and " + words[-1]


def _article(word: str) -> str:
    if word.startswith(("usb", "uni", "one", "eu")):
        return "a"
    if word.startswith(("hdmi", "hour")) or word[:1] in ("a", "e", "i", "o", "u"):
        return "an"
    return "a"


def _with_article(noun: str) -> str:
    if noun in _PLURAL_NOUNS or noun in _MASS_NOUNS:
        return noun
    return f"{_article(noun)} {noun}"


def _fix_articles(text: str, noun: str) -> str:
    """Replace each '{article}' by 'a'/'an' for the next word, or by nothing before plural and mass nouns."""
    countable = noun not in _PLURAL_NOUNS and noun not in _MASS_NOUNS
    parts = text.split("{article}")
    out = [parts[0]]
    for part in parts[1:]:
        part = part.lstrip()
        out.append(f"{_article(part)} {part}" if countable else part)
    return " ".join("".join(out).split())


def _product_of_lengths(groups: dict[str, list[str]]) -> int:
    total = 1
    for values in groups.values():
        total *= max(1, len(values))
    return total
