"""The environment service: text environments behind one contract (``envs``), served over HTTP (``api``)."""

from ._moved import install as _install_moved_modules
from .setting_aliases import adopt_old_names as _adopt_old_setting_names

_adopt_old_setting_names()  # WEBSHOP_ENVS and the other old names: AGENTRL_*, before any setting is read

_install_moved_modules()  # agent_envs.core, .search, .catalog, .conformance: old names of envs.webshop's parts
