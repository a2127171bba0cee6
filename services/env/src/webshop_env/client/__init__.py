"""Clients of the environment service (``WebShopClient`` for the native, stateless protocol)."""

from .native import WebShopClient, WebShopError, WebShopRequestError, WebShopUnavailable

__all__ = ["WebShopClient", "WebShopError", "WebShopRequestError", "WebShopUnavailable"]
