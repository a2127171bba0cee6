"""``webshop_trainer``: the trainer's old name, kept for one release. The package is ``agent_trainer`` now (it trains
on every served environment, not WebShop alone), and the command ``agent-train``.

``import webshop_trainer.X`` gives the very module ``agent_trainer.X`` (same objects, so a class named by its old
path in a config, e.g. ``webshop_trainer.agent_loop.EnvAgentLoop``, is the class verl registers), with a
DeprecationWarning saying the new name (``agent_envs.module_aliases``, the hook that the env service's old name
uses too).
"""

from agent_envs.module_aliases import alias_package

alias_package(
    "webshop_trainer",
    "agent_trainer",
    why="the trainer trains on every served environment; the webshop-train command is agent-train",
)
