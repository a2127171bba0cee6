"""Conformance against the original WebShop: record episodes from a text environment, replay them here.

``adapter`` drives a text environment through one small interface (the original's ``WebAgentTextEnv`` from a
user's own checkout, or this project's ``WebShopEnv``); ``episodes`` is the reproducible episode plan;
``record`` writes traces in the fixture format (tests/fixtures/conformance/README.md); ``check`` replays them
against a prepared catalog and reports every step that differs.
"""
