"""Clients of the environment service: ``EnvClient`` (any environment's native protocol, ``/<env>/v1``) and
``WebShopClient`` (WebShop's own routes), over one transport with retries and hedging (``base.ServiceClient``)."""

from ..module_aliases import renamed_attributes
from .base import (
    ERRORS_RENAMED,
    OLD_ERROR_NAMES,
    ServiceClient,
    ServiceError,
    ServiceRequestError,
    ServiceUnavailable,
)
from .envs import EnvClient
from .native import WebShopClient

__all__ = [
    "EnvClient",
    "ServiceClient",
    "ServiceError",
    "ServiceRequestError",
    "ServiceUnavailable",
    "WebShopClient",
]

#: The errors' old names (``WebShopError``, ...), for one release (with a deprecation warning).
__getattr__ = renamed_attributes(__name__, OLD_ERROR_NAMES, ERRORS_RENAMED)
