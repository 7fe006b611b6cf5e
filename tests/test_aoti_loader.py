"""AOTInductor packages load through torch's package loader itself, skipping the pt2 reader's
CPU ISA probe (see :mod:`cuvil_pgc.recompile.aoti_loader`); where this torch's loader takes other
arguments, torch's public call loads them. A real package's fresh-process load is pinned in
``test_recompile_build`` (it needs an AOTInductor compile)."""

from __future__ import annotations

# imported before a test deletes torch's loader: this module's annotations name it, so importing
# it afterwards fails in torch itself (as it did where that test ran first in its worker)
import torch
import torch._inductor.package  # noqa: F401

from cuvil_pgc.recompile import aoti_loader


class Loader:
    """torch's loader signature: (path, model name, run single-threaded, runners, device index)."""

    def __init__(self, path: str, name: str, single_threaded: bool, runners: int, device: int) -> None:
        self.args = (path, name, single_threaded, runners, device)


class OlderLoader:
    def __init__(self, path: str, name: str) -> None:
        raise AssertionError("not reached: the arguments do not fit")


def _public_calls(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(torch._inductor, "aoti_load_package", lambda path: calls.append(path) or "public")
    return calls


def test_a_package_is_loaded_by_torchs_loader_with_torchs_defaults(monkeypatch):
    public = _public_calls(monkeypatch)
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Loader)
    model = aoti_loader.load_aoti_package("/builds/region.pt2")
    assert model.loader.args == ("/builds/region.pt2", "model", False, 1, -1)
    assert callable(model) and public == []


def test_a_loader_of_another_signature_leaves_the_load_to_torchs_public_call(monkeypatch):
    public = _public_calls(monkeypatch)
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", OlderLoader)
    assert aoti_loader.load_aoti_package("/builds/region.pt2") == "public"
    assert public == ["/builds/region.pt2"]


def test_a_torch_without_the_loader_uses_the_public_call(monkeypatch):
    public = _public_calls(monkeypatch)
    monkeypatch.delattr(torch._C._aoti, "AOTIModelPackageLoader")
    assert aoti_loader.load_aoti_package("/builds/region.pt2") == "public"
    assert public == ["/builds/region.pt2"]


def test_the_process_asks_for_amx_before_the_package_loads(monkeypatch):
    """Inductor's bf16 GEMM kernels use AMX where the CPU has it; a process must ask Linux for it
    first (torch's ISA probe, which the direct load skips, asked as a side effect). Without it a
    fresh process died of SIGILL on the package's first call (exit code 132, measured on an AMX Xeon)."""
    order: list[str] = []

    class Recording(Loader):
        def __init__(self, *args) -> None:
            order.append("load")
            super().__init__(*args)

    monkeypatch.setattr(torch.cpu, "_init_amx", lambda: order.append("amx") or True)
    monkeypatch.setattr(torch._C._aoti, "AOTIModelPackageLoader", Recording)
    aoti_loader.load_aoti_package("/builds/region.pt2")
    assert order == ["amx", "load"]
