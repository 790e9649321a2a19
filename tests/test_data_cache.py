"""Tests of rhhjax.data.cache: the cache folder, hashing and atomic writes (no network)."""

from __future__ import annotations

import hashlib

from rhhjax.data import cache


def test_cache_root_follows_rhhjax_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("RHHJAX_CACHE", str(tmp_path / "c"))
    assert cache.cache_root() == tmp_path / "c"
    monkeypatch.delenv("RHHJAX_CACHE")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache.cache_root() == tmp_path / "home" / ".cache" / "rhhjax"


def test_sha256_of_file_and_bytes_agree_with_hashlib(tmp_path):
    blob = bytes(range(256)) * 5000  # > 1 MiB: several blocks
    path = tmp_path / "blob"
    path.write_bytes(blob)
    want = hashlib.sha256(blob).hexdigest()
    assert cache.sha256_file(path) == cache.sha256_bytes(blob) == want


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"old")
    cache.atomic_write(path, b"new contents")
    assert path.read_bytes() == b"new contents"
    assert [p.name for p in tmp_path.iterdir()] == ["f"]
    assert path.stat().st_mode & 0o777 == 0o644
