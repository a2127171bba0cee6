"""Every environment's entries in configs/agent_loop.yaml and configs/interaction.yaml are derived
from what it registers (agent_trainer.envs.entries): the committed files are what the registry renders now
(`agent-train configs --write` rewrites them, `--check` says which is stale), and each entry says what its trainer
spec and its registration say (its agent loop's name, its id, a client timeout above the balancer's window)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml
from omegaconf import OmegaConf

from agent_envs.envs import registry
from agent_envs.envs.registration import Registration, Timeouts
from agent_trainer import envs
from agent_trainer.cli import main
from agent_trainer.envs import entries

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"
#: This project's environments (installed plugins would add entries of their own: not the committed files').
BUILTIN = [registration.id for registration in registry.BUILTIN]
OTHERS = [e for e in BUILTIN if e != envs.WEBSHOP]


@pytest.fixture
def configs(tmp_path: Path) -> Path:
    """A copy of the two declaration files."""
    for name in (entries.AGENT_LOOP_FILE, entries.INTERACTION_FILE):
        shutil.copy(CONFIGS / name, tmp_path / name)
    return tmp_path


def test_the_committed_entries_are_the_registrys() -> None:
    assert entries.stale_files(CONFIGS, BUILTIN) == [], "stale: run `agent-train configs --write`"


@pytest.mark.parametrize("env_id", OTHERS)
def test_each_environments_entries_say_what_it_registers(env_id: str) -> None:
    spec, timeouts = envs.get(env_id), registry.registration(env_id).timeouts
    loops = {e["name"]: e for e in yaml.safe_load((CONFIGS / entries.AGENT_LOOP_FILE).read_text())}
    interactions = {e["name"]: e for e in yaml.safe_load((CONFIGS / entries.INTERACTION_FILE).read_text())["interaction"]}  # fmt: skip
    loop, interaction = loops[spec.agent_name], interactions[env_id]
    webshop_loop, webshop_interaction = loops["webshop_agent"], interactions["webshop"]
    assert (loop["_target_"], loop["env_id"]) == (entries.AGENT_LOOP_CLASS, env_id)
    assert (
        interaction["class_name"] == entries.INTERACTION_CLASS and interaction["config"]["env_id"] == env_id
    )
    # the rounds are the spec's or the training config's (turns.episode_rounds), never an entry's
    assert not {"max_steps", "max_rounds"} & {
        *loop,
        *webshop_loop,
        *interaction["config"],
        *webshop_interaction["config"],
    }
    own = {"name", "_target_", "env_id", "timeout"}
    for entry, webshop in ((loop, webshop_loop), (interaction["config"], webshop_interaction["config"])):
        # WebShop's settings (<<:) but its own; the client waits out the balancer's window for one request
        assert {k: v for k, v in entry.items() if k not in own} == {
            k: v for k, v in webshop.items() if k not in own
        }
        assert entry["timeout"] == max(timeouts.retry_window_s, webshop["timeout"]) > timeouts.read_s
    assert loops["sciworld_agent"]["timeout"] == interactions["sciworld"]["config"]["timeout"] == 90.0


def test_a_deleted_entry_is_stale_and_write_puts_it_back(
    configs: Path, capsys: pytest.CaptureFixture
) -> None:
    """The injected fault: BabyAI's agent loop deleted by hand. The check names the file; --write restores it."""
    path = configs / entries.AGENT_LOOP_FILE
    text = path.read_text()
    start = text.index("# BabyAI:")
    path.write_text(text[:start] + text[text.index("# SciWorld:", start) :])
    assert "babyai_agent" not in {e.name for e in OmegaConf.load(path)}
    assert entries.stale_files(configs, BUILTIN) == [path]
    assert main(["configs", "--check", "--config-dir", str(configs)]) == 1
    assert f"stale: {path}" in capsys.readouterr().out
    assert main(["configs", "--write", "--config-dir", str(configs)]) == 0
    assert path.read_text() == text
    assert main(["configs", "--config-dir", str(configs)]) == 0
    assert "up to date" in capsys.readouterr().out


def test_a_changed_registration_changes_the_timeout(configs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The timeouts come from the registration: a slower balancer window for TextCraft gives its entries a longer
    timeout, and the committed files are stale until rewritten."""
    real = registry.registration

    def slower(env_id: str) -> Registration:
        found = real(env_id)
        if env_id != "textcraft":
            return found
        return Registration(**{**found.__dict__, "timeouts": Timeouts(read_s=30.0, retry_window_s=45.0)})

    monkeypatch.setattr(registry, "registration", slower)
    assert set(entries.stale_files(configs, BUILTIN, write=True)) == {
        configs / entries.AGENT_LOOP_FILE,
        configs / entries.INTERACTION_FILE,
    }
    loops = {e["name"]: e for e in yaml.safe_load((configs / entries.AGENT_LOOP_FILE).read_text())}
    assert loops["textcraft_agent"]["timeout"] == 45.0 and loops["babyai_agent"]["timeout"] == 10.0


def test_a_plugins_environment_gets_its_entries(configs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An environment registered by a package (its registration's trainer= spec): entries of its own, with the
    timeout its sticky placement's window asks for."""
    import dataclasses

    spec = dataclasses.replace(
        envs.get("textcraft"), env_id="sokoban", title="Sokoban: push the boxes", max_rounds=40
    )
    registration = Registration(id="sokoban", module="sokoban_env", title="Sokoban", placement="sticky",
                                hedge=False, timeouts=Timeouts(read_s=20.0, retry_window_s=30.0))  # fmt: skip
    monkeypatch.setattr(envs, "plugins", lambda: {"sokoban": spec})
    real = registry.registration
    monkeypatch.setattr(registry, "registration", lambda e: registration if e == "sokoban" else real(e))
    entries.stale_files(configs, [*BUILTIN, "sokoban"], write=True)
    loops = {e.name: e for e in OmegaConf.load(configs / entries.AGENT_LOOP_FILE)}
    interactions = {e.name: e for e in OmegaConf.load(configs / entries.INTERACTION_FILE).interaction}
    assert (loops["sokoban_agent"].env_id, loops["sokoban_agent"].timeout) == ("sokoban", 30.0)
    assert loops["sokoban_agent"].env_url == loops["webshop_agent"].env_url  # WebShop's settings
    assert (interactions["sokoban"].config.env_id, interactions["sokoban"].config.timeout) == (
        "sokoban",
        30.0,
    )
    assert "# Sokoban: push the boxes" in (configs / entries.AGENT_LOOP_FILE).read_text()


def test_the_generated_entries_inherit_the_hand_written_ones(configs: Path) -> None:
    """The entries written by hand (outside the generated blocks) are read from the files, not named in the code:
    the first environment's there (WebShop's) gives the seconds per attempt the generated entries inherit, and an
    environment whose entries are written by hand gets none generated."""
    loop_path, interaction_path = configs / entries.AGENT_LOOP_FILE, configs / entries.INTERACTION_FILE
    assert list(entries.hand_written(configs)) == ["webshop"]
    # WebShop's own client waits longer than SciWorld's window: SciWorld's entries need no timeout of their own
    for path in (loop_path, interaction_path):
        path.write_text(path.read_text().replace("timeout: 10.0", "timeout: 100.0", 1))
    entries.stale_files(configs, BUILTIN, write=True)
    loops = {e["name"]: e for e in yaml.safe_load(loop_path.read_text())}
    interactions = {e["name"]: e for e in yaml.safe_load(interaction_path.read_text())["interaction"]}
    assert loops["sciworld_agent"]["timeout"] == interactions["sciworld"]["config"]["timeout"] == 100.0
    assert "timeout: 90.0" not in loop_path.read_text()
    # TextCraft's entries moved out of the generated block, written by hand: none generated for it any more
    loop_text = loop_path.read_text()
    start = loop_text.index("# TextCraft:")
    block = loop_text[start : loop_text.index("# BabyAI:", start)]
    loop_path.write_text(loop_text.replace(block, "").replace(entries.BEGIN, block + entries.BEGIN))
    text = interaction_path.read_text()
    start = text.index("  # TextCraft:")
    block = text[start : text.index("  # BabyAI:", start)]
    interaction_path.write_text(
        text.replace(block, "").replace("  " + entries.BEGIN, block + "  " + entries.BEGIN)
    )
    assert list(entries.hand_written(configs)) == ["webshop", "textcraft"]
    assert entries.stale_files(configs, BUILTIN) == []
    assert [e["name"] for e in yaml.safe_load(loop_path.read_text())].count("textcraft_agent") == 1


def test_a_file_without_its_markers_is_refused(configs: Path, capsys: pytest.CaptureFixture) -> None:
    path = configs / entries.INTERACTION_FILE
    path.write_text(path.read_text().replace(entries.END, "# (gone)"))
    with pytest.raises(entries.StaleEntries, match="expected one generated block"):
        entries.render(configs, BUILTIN)
    assert main(["configs", "--check", "--config-dir", str(configs)]) == 2
    assert "expected one generated block" in capsys.readouterr().err


def test_show_prints_the_composed_config(capsys: pytest.CaptureFixture) -> None:
    """Every hyper-parameter of a run, as main_ppo gets it: the environment's file over its base (either line)."""
    assert main(["configs", "--show", "textcraft_grpo_test", "--verl-line", "0.9", "--without-verl",
                 "trainer.total_epochs=3"]) == 0  # fmt: skip
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["trainer"]["total_epochs"] == 3 and shown["environments"]["textcraft"]["max_rounds"] == 30
    assert shown["actor_rollout_ref"]["rollout"]["agent"]["default_agent_loop"] == "textcraft_agent"
    assert shown["data"]["return_raw_chat"] is True  # the base's
    assert main(["configs", "--show", "nothing_grpo_test"]) == 2
    assert "no training config" in capsys.readouterr().err
