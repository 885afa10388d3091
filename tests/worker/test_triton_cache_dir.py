"""The Triton cache directory a worker pins at its start: Inductor's, unless the user set one."""

from __future__ import annotations

import os

from compiled_llm.compat import pin_triton_cache_dir


def test_pinned_to_inductors_directory(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", "x")  # recorded, so teardown removes the pin
    monkeypatch.delenv("TRITON_CACHE_DIR")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    expected = str(tmp_path / "triton" / "1")
    assert pin_triton_cache_dir(1) == expected
    assert os.environ["TRITON_CACHE_DIR"] == expected


def test_a_users_directory_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    assert pin_triton_cache_dir(0) == str(tmp_path / "mine")
