"""hack/disk.py, the free-space check `make test` runs first."""

from __future__ import annotations

import shutil
import tempfile

from hack import disk


def test_enough_room_passes_and_too_little_fails_naming_the_largest_cache_folder(tmp_path, monkeypatch, capsys):
    cache = tmp_path / "cache"
    (cache / "node").mkdir(parents=True)
    (cache / "node" / "blob").write_bytes(b"x" * 3_000_000)
    (cache / "small").mkdir()
    monkeypatch.setenv("RLSCALE_CACHE", str(cache))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # the listing looks at ~/.cache and the temp dir too
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temp"))
    (tmp_path / "temp").mkdir()
    free_gb = shutil.disk_usage(cache).free / disk.GB

    assert disk.main(["--need-gb", "0"]) == 0
    assert "GB free for" in capsys.readouterr().out

    assert disk.main(["--need-gb", str(free_gb + 1000)]) == 1
    err = capsys.readouterr().err
    assert f"under {free_gb + 1000:g} GB free" in err and "RLSCALE_TEST_MIN_FREE_GB" in err
    listed = [line.split()[-1] for line in err.splitlines() if line.strip().endswith(("node", "small"))]
    assert listed[:2] == [str(cache / "node"), str(cache / "small")], err  # the largest first


def test_the_floor_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("RLSCALE_CACHE", str(tmp_path))
    monkeypatch.setenv("RLSCALE_TEST_MIN_FREE_GB", "0")
    assert disk.main([]) == 0
    monkeypatch.setenv("RLSCALE_TEST_MIN_FREE_GB", "1e9")
    assert disk.main([]) == 1
