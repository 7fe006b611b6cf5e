"""Where a loaded build's files are unpacked, and a cache directory other users can write.

A sweep of service deployments found that ``load_build`` unpacked verified members under the cache
directory: another user who could write there swapped a verified OpenVINO file for their own
before the runtime read it (the root service then ran their weights, with no warning), and an
unusable cache directory (read-only, a file, no HOME) made every load fail, even of builds that
unpack nothing.
"""

from __future__ import annotations

import os
import stat
import tempfile

import pytest
import torch
from torch import nn

from cuvil_pgc._cache import cache_dir, not_private
from cuvil_pgc.errors import ConfigError
from cuvil_pgc.recompile import load_build, recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate

pytestmark = pytest.mark.usefixtures("build_env")


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


@pytest.fixture
def saved(tmp_path, keys):
    if not runtimes.check("ort").ok:
        pytest.skip("onnxruntime not installed")
    torch.manual_seed(0)
    model, x = Small().eval(), torch.randn(2, 8)
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    return model, x, build.save(tmp_path / "b.cuvilpkg", signing_key=str(keys[0])), str(keys[1])


def test_a_build_unpacks_into_a_private_directory_that_is_gone_once_loaded(saved, tmp_path, monkeypatch):
    model, x, path, pub = saved
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    seen = []
    real_mkdtemp = tempfile.mkdtemp

    def mkdtemp(*args, **kwargs):
        made = real_mkdtemp(*args, **kwargs)
        seen.append((made, stat.S_IMODE(os.stat(made).st_mode)))
        return made

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp)
    loaded = Small().eval()
    loaded.load_state_dict(model.state_dict())
    fast = load_build(path, loaded, pubkey=pub)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-6) and fast.fallback_calls == 0
    unpacked = [(p, mode) for p, mode in seen if os.path.basename(p).startswith("cuvil-load-")]
    assert unpacked and all(mode == 0o700 for _, mode in unpacked)
    assert not any(os.path.exists(p) for p, _ in unpacked)          # removed once the runtime read it
    assert not (cache_dir() / "loaded").exists()


def test_a_cache_directory_that_cannot_be_used_does_not_stop_a_load(saved, tmp_path, monkeypatch):
    model, x, path, pub = saved
    blocked = tmp_path / "a-file"
    blocked.write_text("not a directory")
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(blocked))
    loaded = Small().eval()
    loaded.load_state_dict(model.state_dict())
    fast = load_build(path, loaded, pubkey=pub)
    with torch.no_grad():
        assert torch.allclose(fast(x), model(x), atol=1e-6)
    assert fast.fallback_calls == 0


def test_a_cache_directory_other_users_can_write_is_refused_by_name(tmp_path, monkeypatch):
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(shared))
    assert cache_dir() == shared and not_private(shared) is None
    shared.chmod(0o777)
    with pytest.raises(ConfigError, match="writable by every user") as err:
        cache_dir()
    assert str(shared) in str(err.value) and "CUVIL_CACHE_DIR" in str(err.value)
    shared.chmod(0o700)
    (tmp_path / "file").write_text("")
    assert not_private(tmp_path / "file") == "is not a directory"
    assert not_private(tmp_path / "missing") is None


def test_recompile_refuses_a_cache_directory_other_users_can_write(tmp_path, monkeypatch):
    shared = tmp_path / "shared-cache"
    shared.mkdir()
    shared.chmod(0o777)
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(shared))
    torch.manual_seed(0)
    with pytest.raises(ConfigError, match="another user could plant"):
        recompile(Small().eval(), (torch.randn(2, 8),), plan={"": Candidate("", "aoti")}, deployed_race=False,
                  rounds=3)
