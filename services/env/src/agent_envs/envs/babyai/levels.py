"""AgentGym's BabyAI task numbering: ``data_idx`` -> level ``data_idx % 40 + 1`` (its ``all_levels`` table,
index 0 unused) and seed ``data_idx // 40``."""

from __future__ import annotations

LEVEL_NAMES: tuple[str, ...] = (
    "GoToRedBallGrey", "GoToRedBall", "GoToRedBallNoDists", "GoToObjS6", "GoToLocalS8N7",
    "GoToObjMazeS7", "GoToImpUnlock", "GoToSeqS5R2", "GoToRedBlueBall", "GoToDoor",
    "GoToObjDoor", "Open", "OpenRedDoor", "OpenDoorLoc", "OpenRedBlueDoorsDebug",
    "OpenDoorsOrderN4Debug", "Pickup", "UnblockPickup", "PickupLoc", "PickupDistDebug",
    "PickupAbove", "PutNextLocalS6N4", "PutNextS7N4Carrying", "Unlock", "UnlockLocalDist",
    "KeyInBox", "UnlockPickupDist", "BlockedUnlockPickup", "UnlockToUnlock", "ActionObjDoor",
    "FindObjS7", "KeyCorridorS6R3", "OneRoomS20", "MoveTwoAcrossS8N9", "SynthS5R2",
    "SynthLoc", "SynthSeq", "MiniBossLevel", "BossLevel", "BossLevelNoUnlock",
)  # fmt: skip
LEVELS: tuple[str, ...] = tuple(f"BabyAI-{name}-v0" for name in LEVEL_NAMES)  # level n is LEVELS[n - 1]


def level_of(data_idx: int) -> tuple[str, int]:
    """(gymnasium id, seed) of a task."""
    return LEVELS[data_idx % len(LEVELS)], data_idx // len(LEVELS)
