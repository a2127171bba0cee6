"""verl GRPO glue for the WebShop environment service.

Modules: ``interaction`` (WebshopInteraction), ``actions`` (action extraction), ``prompts`` (every text the
policy sees), ``reward`` (verl custom reward function), ``data`` (parquet builder), ``preflight`` (CPU checks),
``tiny_model`` and ``local_rollout`` (verl's agent loop on CPU), ``cli`` (``webshop-train``).
Heavy imports (verl, torch) happen in the modules that need them, not here.
"""

__version__ = "0.1.0"
