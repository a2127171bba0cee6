"""The Ray Serve app's arguments and the Serve config file: checked before anything is deployed."""

from __future__ import annotations

import pytest
import yaml

from agent_envs.ray_serve import needs_token_mode
from agent_envs.ray_serve.app import ServeArgs
from agent_envs.ray_serve.deploy import serve_config


def test_defaults_and_known_settings_pass() -> None:
    args = ServeArgs.parse({"catalog": "/shared/catalog", "settings": {"redis_url": "redis://h:6379/0"}})
    assert (args.replicas_per_node, args.replica_cpus, args.state_secret_file) == (1, 0.25, None)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"catalog": "/c", "settings": {"state_secret": "x" * 40}},
            "must not be written into the Serve arguments",
        ),
        ({"catalog": "/c", "settings": {"catalog": "/other"}}, "catalog argument"),
        ({"catalog": "/c", "settings": {"max_stepz": 5}}, "unknown service setting"),
        ({"catalog": "/c", "replicas_per_node": 0}, "at least 1"),
        ({"catalog": "/c", "replica_cpus": -1}, "between 0 and 64"),
        ({"catalog": "/c", "colour": "red"}, "unknown Serve argument"),
    ],
)
def test_bad_arguments_are_refused_with_the_reason(values: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ServeArgs.parse(values)


def test_serve_config_names_the_builder_and_carries_no_secret() -> None:
    args = ServeArgs.parse(
        {"catalog": "/shared/catalog", "replicas_per_node": 2, "state_secret_file": "/s/secret"}
    )
    config = serve_config(args, "webshop", 36080)
    text = yaml.safe_dump(config)
    app = config["applications"][0]
    assert app["import_path"] == "agent_envs.ray_serve.app:build"
    assert config["proxy_location"] == "EveryNode" and config["http_options"]["port"] == 36080
    assert ServeArgs.parse(app["args"]) == args  # what `serve run/deploy` hands the builder round-trips
    assert "state_secret:" not in text


def test_token_mode_only_when_a_token_exists_and_no_mode_is_set(tmp_path, monkeypatch) -> None:
    import agent_envs.ray_serve as module

    monkeypatch.setattr(module, "DEFAULT_TOKEN_PATH", tmp_path / "auth_token")
    assert needs_token_mode({}) is False
    assert needs_token_mode({"RAY_AUTH_TOKEN": "t"}) is True
    (tmp_path / "auth_token").write_text("t")
    assert needs_token_mode({}) is True
    assert needs_token_mode({"RAY_AUTH_MODE": "disabled"}) is False


def test_a_replica_without_webshop_needs_no_catalog_and_one_with_it_names_what_is_missing(
    generated_catalog_dir, tmp_path
) -> None:
    from agent_envs.api.settings import SettingsError
    from agent_envs.ray_serve.app import replica_settings

    secret = "serve-args-test-secret-0123456789abcdef"
    alone = replica_settings(ServeArgs.parse({"settings": {"envs": "textcraft,babyai"}}), secret, "10.0.0.7")
    assert alone.env_ids() == ["textcraft", "babyai"]
    with pytest.raises(
        SettingsError, match=r"node 10\.0\.0\.7 cannot serve webshop: .*not a prepared catalog"
    ):
        replica_settings(ServeArgs.parse({"catalog": str(tmp_path), "settings": {"envs": "webshop"}}), secret,
                         "10.0.0.7")  # fmt: skip
    served = ServeArgs.parse(
        {"catalog": str(generated_catalog_dir), "settings": {"envs": "webshop,textcraft"}}
    )
    assert replica_settings(served, secret, "10.0.0.7").catalog == generated_catalog_dir


def test_the_deployment_class_s_old_name_works_for_a_release_with_a_deprecation_line() -> None:
    """``WebShopReplica`` (the class's name while WebShop was the one environment) is ``EnvReplica``, warned."""
    from agent_envs.ray_serve import app

    with pytest.warns(DeprecationWarning, match="EnvReplica now"):
        assert app.WebShopReplica is app.EnvReplica
    with pytest.raises(AttributeError):
        app.NoSuchReplica  # noqa: B018
