"""``webshop_env``: the env service's old name, kept for one release. The package is ``agent_envs`` now (it serves
every environment, not WebShop alone), the command ``agent-envs`` and the distribution ``agent-envs``.

``import webshop_env.X`` gives the very module ``agent_envs.X``, with a DeprecationWarning that names the new one
(``agent_envs.module_aliases``, the hook that the trainer's old name uses too).
"""

from agent_envs.module_aliases import alias_package

alias_package("webshop_env", "agent_envs", why="the env service serves every environment, not WebShop alone")
