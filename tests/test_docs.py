"""The docs that are generated from code stay current."""

from pathlib import Path

from infermeter.settings_doc import render_settings_doc

ROOT = Path(__file__).resolve().parent.parent


def test_settings_doc_lists_every_setting():
    assert (ROOT / "docs" / "settings.md").read_text() == render_settings_doc(), (
        "docs/settings.md is stale: run `python -m infermeter.settings_doc`"
    )


def test_readme_gives_the_two_commands_and_ci_runs_the_test_one():
    readme = (ROOT / "README.md").read_text()
    assert "scripts/demo" in readme and "scripts/test" in readme
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()


def test_settings_read_only_their_documented_variables(monkeypatch):
    from pathlib import Path

    from infermeter.settings import Settings

    monkeypatch.setenv("HOME", "/somewhere/else")  # the field is `home`; the variable is INFERMETER_HOME
    monkeypatch.setenv("API_PORT", "1")
    monkeypatch.delenv("INFERMETER_HOME", raising=False)
    monkeypatch.delenv("INFERMETER_API_PORT", raising=False)
    settings = Settings()
    assert settings.home == Path(".infermeter") and settings.api_port == 8600
    monkeypatch.setenv("INFERMETER_HOME", "/data/im")
    assert Settings().home == Path("/data/im")
