"""Configuration: precedence and clear errors for bad values."""

from __future__ import annotations

import pytest

import fnmap
from fnmap.config import resolve


def test_defaults():
    c = resolve()
    assert c.backend == "emulator" and c.chunksize is None and c.retries == 2  # None: automatic


def test_keyword_beats_environment_beats_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fnmap.toml").write_text('retries = 5\nchunksize = 3\ntimeout = 9\n')
    monkeypatch.setenv("FNMAP_CHUNKSIZE", "4")
    c = resolve(timeout=2)
    assert c.retries == 5 and c.source("retries").startswith("config file")
    assert c.chunksize == 4 and c.source("chunksize") == "the environment"
    assert c.timeout == 2 and c.source("timeout") == "keyword"


def test_config_file_fnmap_table(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "fnmap.toml").write_text('[fnmap]\nbackend = "local"\n')
    assert resolve().backend == "local"


def test_unknown_backend_from_environment_names_value_source_and_choices(monkeypatch):
    monkeypatch.setenv("FNMAP_BACKEND", "lamda")
    with pytest.raises(fnmap.UnknownBackend) as info:
        fnmap.map(abs, [1])
    msg = str(info.value)
    assert "FNMAP_BACKEND='lamda'" in msg and "environment" in msg and "emulator" in msg
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_bad_chunksize(value):
    with pytest.raises(fnmap.ConfigError, match="chunksize"):
        fnmap.map(abs, [1], chunksize=value)


def test_malformed_storage_url():
    with pytest.raises(fnmap.ConfigError, match="storage"):
        fnmap.map(abs, [1], storage="/tmp/no-scheme")


def test_unknown_storage_scheme(tmp_path):
    with pytest.raises(fnmap.UnknownStorage, match="gs"):
        fnmap.map(abs, [1], storage="gs://bucket/x")


def test_unreachable_emulator_url():
    with pytest.raises(fnmap.ConfigError, match="not reachable"):
        fnmap.map(abs, [1], emulator_url="http://127.0.0.1:9")


def test_unknown_option_is_a_type_error():
    with pytest.raises(TypeError, match="chunk_size"):
        fnmap.map(abs, [1], chunk_size=3)


def test_bad_environment_number(monkeypatch):
    monkeypatch.setenv("FNMAP_RETRIES", "many")
    with pytest.raises(fnmap.ConfigError, match="FNMAP_RETRIES='many'"):
        resolve()


def test_bad_retry_on():
    with pytest.raises(fnmap.ConfigError, match="retry_on"):
        resolve(retry_on=("ValueError",))


@pytest.mark.parametrize("value, message", [
    ("ValueError", r"retry_on='ValueError' \(from keyword\) is a string; pass exception classes, "
                   r"e.g. retry_on=\(ValueError,\)"),
    (5, r"retry_on=5 \(from keyword\) is not an exception class or a tuple of them"),
])
def test_retry_on_that_is_not_exception_classes(value, message):
    with pytest.raises(fnmap.ConfigError, match=message):
        resolve(retry_on=value)


@pytest.mark.parametrize("name, value", [("progress", "yes"), ("progress", 1), ("speculation", "no")])
def test_switches_take_booleans_only(name, value):
    with pytest.raises(fnmap.ConfigError, match=rf"{name}={value!r} \(from keyword\) must be True"):
        resolve(**{name: value})
    assert resolve(progress=True).progress is True


def test_an_unknown_fnmap_variable_is_named_with_the_close_match(monkeypatch):
    import warnings

    monkeypatch.setenv("FNMAP_CHUNK_SIZE", "10")
    monkeypatch.setattr("fnmap.config._warned_variables", set())
    with pytest.warns(UserWarning, match="FNMAP_CHUNK_SIZE is not a setting fnmap reads.*did you mean FNMAP_CHUNKSIZE"):
        resolve()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per process, not once per job
        resolve()
    monkeypatch.delenv("FNMAP_CHUNK_SIZE")
    monkeypatch.setenv("FNMAP_S3_ENDPOINT_URL", "http://127.0.0.1:9000")  # read by the s3 store
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve()


def test_an_unknown_fnmap_variable_is_warned_at_the_users_line(monkeypatch):
    """The warning names the line that called fnmap (here, this file), not fnmap's own frames
    (``fnmap/api.py``) between it and where the settings are read."""
    monkeypatch.setenv("FNMAP_CHUNK_SIZE", "10")
    monkeypatch.setattr("fnmap.config._warned_variables", set())
    with pytest.warns(UserWarning, match="FNMAP_CHUNK_SIZE is not a setting") as caught:
        assert fnmap.map(abs, [-1]) == [1]
    assert [w.filename for w in caught if "FNMAP_CHUNK_SIZE" in str(w.message)] == [__file__]


def test_each_backend_option_is_a_keyword_a_variable_and_identifies_the_deployment(monkeypatch):
    """Declared once in fnmap.backend_table, an option of one backend is a keyword, an FNMAP_ variable,
    parsed by its type, and part of the deployment key (a change starts another client)."""
    from fnmap.backend_table import BACKEND_OPTIONS

    declared = {o.name: o for options in BACKEND_OPTIONS.values() for o in options}
    assert {"function_name", "lambda_fanout", "job_queue", "emulator_url", "http_url"} <= set(declared)
    base = resolve()
    for name, option in declared.items():
        value = {"int": 7, "float": 7.5}.get(option.kind, "--seed 7" if name == "emulator_options" else "http://127.0.0.1:1/x")
        assert getattr(resolve(**{name: value}), name) == value
        assert resolve(**{name: value}).deployment_key() != base.deployment_key(), name
        monkeypatch.setenv(option.variable, str(value))
        got = resolve()
        assert getattr(got, name) == value and got.source(name) == "the environment", name
        monkeypatch.delenv(option.variable)
