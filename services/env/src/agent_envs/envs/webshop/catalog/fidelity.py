"""What a prepared catalog can and cannot reproduce of the original, read from its manifest.

Scores equal the original's step for step only when the numbers the original draws at random (range prices,
goal price ceilings) and the title nouns (spaCy) come from a reference run of the original (``pinned``).
``catalog info`` prints this next to the manifest; ``agent-envs conformance check`` measures it. Eval
outputs and training logs record it next to the catalog's fingerprint (``describe_fidelity``), so that two
scores computed under different reward definitions never look comparable.
"""

from __future__ import annotations

from typing import Any

from ..core.nouns import HEURISTIC


def fidelity_limits(manifest: dict[str, Any]) -> dict[str, Any]:
    """A short account of the catalog's pins and noun extractor, with what each means for rewards."""
    prices = str(manifest.get("prices", "?"))
    ceilings = manifest.get("price_ceilings", {}) or {}
    nouns = str(manifest.get("noun_extractor", "?"))
    limits: list[str] = []
    if not prices.startswith("pinned"):
        limits.append(
            "point prices of price ranges are drawn from a fixed seed here; the original draws them unseeded, "
            "so r_price (and prices on pages) can differ from any given run of it"
        )
    seeded = sorted(s for s, v in ceilings.items() if not str(v).startswith("pinned"))
    if seeded:
        limits.append(
            f"goal price ceilings of {', '.join(seeded)} are seeded; instructions' 'price lower than' numbers "
            "differ from any given run of the original"
        )
    if nouns.startswith(HEURISTIC.split("-v")[0]):
        limits.append(
            f"title nouns from the {nouns} extractor, not spaCy: the type reward's title score differs from the "
            "original's on some purchases (`make spacy`, then prepare again)"
        )
    elif nouns.startswith("spacy"):
        limits.append(
            f"title nouns from {nouns}; identical to the original's only with the same spaCy and model versions "
            "(the original pins none; the committed traces used spaCy 3.8 with en_core_web_sm 3.8)"
        )
    return {
        "prices": prices,
        "price_ceilings": ceilings,
        "noun_extractor": nouns,
        "exact": prices.startswith("pinned") and not seeded and nouns == "pinned",
        "limits": limits,
    }


def describe_fidelity(fidelity: dict[str, Any]) -> str:
    """One line for reports and logs: noun extractor, prices, price ceilings, and whether rewards are exact."""
    ceilings = fidelity.get("price_ceilings") or {}
    ceiling_text = ", ".join(f"{name} {value}" for name, value in sorted(ceilings.items())) or "?"
    exact = (
        "exact: the original's rewards" if fidelity.get("exact") else "not pinned to a run of the original"
    )
    return (
        f"title nouns {fidelity.get('noun_extractor', '?')}; prices {fidelity.get('prices', '?')}; "
        f"price ceilings {ceiling_text} ({exact})"
    )
