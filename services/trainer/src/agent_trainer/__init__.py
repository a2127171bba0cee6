"""verl GRPO on the served text environments (WebShop, TextCraft, BabyAI, SciWorld); ``webshop_trainer`` is this
package's old name, an alias for one release.

Modules: ``interaction`` (WebshopInteraction), ``actions`` (action extraction), ``prompts`` (every text the
policy sees), ``reward`` (verl custom reward function), ``data`` (parquet builder), ``preflight`` (CPU checks),
``tiny_model``, ``rehearsal`` (verl on CPU: the preflight's in-process workers and the whole training run,
``make rehearse``), ``cli`` (``agent-train``).
Heavy imports (verl, torch) happen in the modules that need them, not here.
"""

__version__ = "0.1.0"
