"""The environment service: text environments behind one contract (``envs``), served over HTTP (``api``)."""

from ._moved import install as _install_moved_modules

_install_moved_modules()  # agent_envs.core, .search, .catalog, .conformance: old names of envs.webshop's parts
