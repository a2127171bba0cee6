"""Which way ``agent-train eval`` plays each environment comes from its spec (``EnvSpec.eval_protocol``), never from
its id: WebShop's goal sets and pages (``PagePlay``), every other environment through its spec (``SpecPlay``)."""

from __future__ import annotations

from dataclasses import replace

import pytest


def test_each_environment_is_played_by_the_protocol_its_spec_names() -> None:
    from agent_trainer import envs
    from agent_trainer.evaluation.runner import PagePlay, SpecPlay, play_of

    assert envs.get("webshop").eval_protocol == "pages"
    assert type(play_of("webshop")) is PagePlay
    for env_id in envs.ids():
        if env_id != "webshop":
            assert type(play_of(env_id)) is SpecPlay, env_id
    assert play_of("textcraft", max_observation_chars=300).max_observation_chars == 300


def test_a_spec_naming_webshops_protocol_is_played_like_webshop(monkeypatch: pytest.MonkeyPatch) -> None:
    from agent_trainer import envs
    from agent_trainer.evaluation.runner import EvalError, PagePlay, play_of

    monkeypatch.setitem(envs.SPECS, "textcraft", replace(envs.get("textcraft"), eval_protocol="pages"))
    assert type(play_of("textcraft")) is PagePlay
    monkeypatch.setitem(envs.SPECS, "textcraft", replace(envs.get("textcraft"), eval_protocol="telepathy"))
    with pytest.raises(EvalError, match="'telepathy'; eval knows spec, pages"):
        play_of("textcraft")
