"""Data paths as module constants, like the original's (the conformance adapter overrides them)."""

DEFAULT_FILE_PATH = "../data/items_shuffle_1000.json"
DEFAULT_ATTR_PATH = "../data/items_ins_v2_1000.json"
HUMAN_ATTR_PATH = "../data/items_human_ins.json"
