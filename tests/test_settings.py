"""The call path's single-variable readers see every change made through os.environ (the tests turn settings that
way), by the fast lookup and without it."""

import os

import pytest

from anybit import settings


def test_reads_follow_os_environ(monkeypatch):
    monkeypatch.delenv("ANYBIT_FRAG_WS_MAX_M", raising=False)
    assert settings.frag_ws_max_m() == 1024 and settings._env("ANYBIT_FRAG_WS_MAX_M") is None
    monkeypatch.setenv("ANYBIT_FRAG_WS_MAX_M", " 512 ")
    assert settings.frag_ws_max_m() == 512
    os.environ["ANYBIT_FRAG_WS_MAX_M"] = "0"
    assert settings.frag_ws_max_m() == 0
    monkeypatch.setenv("ANYBIT_FAST_LAUNCH", "0")
    assert not settings.fast_launch() and not settings.load().fast_launch
    monkeypatch.delenv("ANYBIT_FAST_LAUNCH")
    assert settings.fast_launch()
    monkeypatch.setenv("ANYBIT_FRAG_WS_MAX_M", "many")
    with pytest.raises(ValueError, match="ANYBIT_FRAG_WS_MAX_M='many': expected a row count"):
        settings.frag_ws_max_m()


def test_a_replaced_environ_is_read_as_it_is(monkeypatch):
    monkeypatch.setattr(os, "environ", {"ANYBIT_PDL": "0"})  # a mapping without CPython's bytes dict
    assert settings._env("ANYBIT_PDL") == "0" and not settings.pdl()
