"""Clients of the environment service: ``EnvClient`` (any environment's native protocol, ``/<env>/v1``) and
``WebShopClient`` (WebShop's own routes), over one transport with retries and hedging (``base.ServiceClient``)."""

from .base import ServiceClient, WebShopError, WebShopRequestError, WebShopUnavailable
from .envs import EnvClient
from .native import WebShopClient

__all__ = ["EnvClient", "ServiceClient", "WebShopClient", "WebShopError", "WebShopRequestError",
           "WebShopUnavailable"]  # fmt: skip
