"""verl GRPO on the served text environments (WebShop, TextCraft, BabyAI, SciWorld); ``webshop_trainer`` is this
package's old name, an alias for one release.

Modules, lowest layer first (``scripts/import_graph.py`` checks that no import runs back up): ``config``,
``turns``, ``reward``; ``envs`` (one module per environment: spec, prompt, parser, split rule, rows); ``episode``
(one episode of any environment); the verl adapters (``agent_loop``, ``interaction``, ``tool_agent_loop``,
``verl_main``); ``data``/``env_data``; ``evaluation``; ``harness`` (the local env cluster, catalog, expert tasks,
stand-in model servers); ``preflight`` and ``rehearsal`` (verl on CPU); ``cli`` (``agent-train``).
Heavy imports (verl, torch) happen in the modules that need them, not here.
"""

__version__ = "0.1.0"
