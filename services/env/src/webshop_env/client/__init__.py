"""Clients of the environment service: ``WebShopClient`` (WebShop's native, stateless protocol) and
``EnvClient`` (the same protocol of the other environments, under ``/<env>/v1``)."""

from .envs import EnvClient
from .native import WebShopClient, WebShopError, WebShopRequestError, WebShopUnavailable

__all__ = ["EnvClient", "WebShopClient", "WebShopError", "WebShopRequestError", "WebShopUnavailable"]
