"""Runtime backends (ONNX Runtime, OpenVINO; TensorRT through a fake) in the plan space, behind the
module's own call, in signed builds; and what doctor says about them."""

from __future__ import annotations

import json
import logging
import os
import sys
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn

from cuvil_pgc.cli.doctor import runtime_check
from cuvil_pgc.errors import BuildError
from cuvil_pgc.instrument import doctor
from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.apply import ScopeInputs, realize
from cuvil_pgc.recompile.candidates import (
    Candidate,
    RuntimeSpace,
    ScopeFeatures,
    generate_space,
    scope_candidates,
)
from cuvil_pgc.recompile.export_error import ExportError, exporter_of_reason
from cuvil_pgc.recompile.trials import SearchOptions

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")
needs_ov = pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))


def feats(label: str = "launch_overhead", scope: str = "", **kw) -> ScopeFeatures:
    return ScopeFeatures(scope=scope, path=scope or "model", bottleneck=label, eager_us=500.0, ops=40,
                         pointwise_ops=10, labels=[label], **kw)


class Structured(nn.Module):
    """Returns a dict with a None entry, a tuple holding a constant, and two tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, scale: torch.Tensor | None = None) -> dict:
        h = torch.relu(self.a(x))
        out = self.b(h) if scale is None else self.b(h) * scale
        return {"out": out, "nothing": None, "pair": (h, 3)}


# -- the plan space ---------------------------------------------------------------------------------
def test_every_scope_gets_the_runtimes_usable_here_with_their_knobs():
    space = RuntimeSpace(("ort", "openvino"), native_bf16=True, threads=2)
    root = {c.config for c in scope_candidates(feats("compute", rewrites=["lstm_cell:rnn"]), runtimes=space)}
    assert {"ort", "openvino", "ort+rewrite", "openvino+rewrite", "ort+opt=extended", "ort+spin=off",
            "ort+exec=parallel", "openvino+bf16"} <= root
    sub = {c.key for c in generate_space([feats(), feats(scope="enc")], runtimes=space)}
    assert {"<model>::ort", "enc::ort", "<model>::openvino", "enc::openvino"} <= sub
    # one thread: no spinning or executor knobs; no native bf16: no OpenVINO bf16; idle: nothing
    plain = {c.config for c in scope_candidates(feats("compute"), runtimes=RuntimeSpace(("ort", "openvino")))}
    assert "ort" in plain and not {"ort+spin=off", "ort+exec=parallel", "openvino+bf16"} & plain
    assert [c.config for c in scope_candidates(feats("idle"), runtimes=space)] == ["eager"]
    # nothing installed: no runtime candidates at all
    assert not any(c.backend in runtimes.RUNTIME_BACKENDS for c in scope_candidates(feats(), runtimes=RuntimeSpace()))


def test_cuda_space_has_the_cuda_providers_and_tensorrt():
    space = RuntimeSpace(("ort", "tensorrt"))
    configs = {c.config for c in scope_candidates(feats("compute"), device="cuda", runtimes=space)}
    assert {"ort+ep=cuda", "ort+ep=tensorrt", "tensorrt", "tensorrt+fp16"} <= configs
    assert "ort" not in configs and not any(c.startswith("openvino") for c in configs)


@needs_ort
def test_a_gpu_machine_with_the_cpu_onnxruntime_package_gets_no_ort_candidates_and_refuses_ort_regions(
        monkeypatch, tmp_path):
    import onnxruntime

    from cuvil_pgc.recompile.ort_runner import OrtRunner

    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    runtimes.reset()
    try:
        status = runtimes.check("ort", "cuda")
        assert not status.ok and "no CUDA execution provider" in status.reason
        assert "onnxruntime-gpu" in status.fix
        assert runtimes.check("ort", "cpu").ok and "ort" not in runtimes.available("cuda")
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)    # doctor on a GPU machine
        described = runtimes.describe("ort")
        assert described.ok and "none for CUDA" in described.detail and "onnxruntime-gpu" in described.detail
        with pytest.raises(BuildError) as info:   # a build made where onnxruntime-gpu was
            OrtRunner(str(tmp_path / "never_parsed.onnx"), {"ep": "cuda"}, None)
        assert "CUDAExecutionProvider" in info.value.problem and "onnxruntime-gpu" in info.value.fix
        with pytest.raises(BuildError, match="'rocm'"):
            OrtRunner(str(tmp_path / "never_parsed.onnx"), {"ep": "rocm"}, None)
        # onnxruntime-gpu without TensorRT: the CUDA provider only
        monkeypatch.setattr(onnxruntime, "get_available_providers",
                            lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
        runtimes.reset()
        assert runtimes.check("ort", "cuda").ok and runtimes.ort_eps() == ("cpu", "cuda")
        space = RuntimeSpace(("ort",), ort_eps=runtimes.ort_eps())
        configs = {c.config for c in scope_candidates(feats("compute"), device="cuda", runtimes=space)}
        assert "ort+ep=cuda" in configs and "ort+ep=tensorrt" not in configs
    finally:
        runtimes.reset()


def test_backends_option_restricts_and_knobs_survive_json():
    space = generate_space([feats()], backends=("ort",), runtimes=RuntimeSpace(("ort", "openvino")))
    assert {c.backend for c in space} == {"eager", "ort"}
    cand = Candidate("enc", "ort", knobs=(("opt", "extended"),))
    assert Candidate.from_json(cand.to_json()) == cand and cand.config == "ort+opt=extended"


def test_cli_accepts_runtime_backends():
    from cuvil_pgc.cli.recompile import _backends

    assert _backends("ort,openvino,aoti") == ("ort", "openvino", "aoti")


# -- doctor -----------------------------------------------------------------------------------------
def test_doctor_lists_each_runtime_and_the_extra_that_installs_a_missing_one(monkeypatch):
    monkeypatch.setitem(sys.modules, "openvino", None)     # import openvino now raises ImportError
    runtimes.reset()
    try:
        checks = {c.name: c for c in doctor.run_checks([runtime_check(b) for b in runtimes.RUNTIME_BACKENDS])}
        ov = checks["OpenVINO (recompile backend)"]
        assert not ov.ok and "openvino is not importable" in ov.reason and "cuvil-pgc[openvino]" in ov.fix
        assert "Torch-TensorRT (recompile backend)" in checks and "ONNX Runtime (recompile backend)" in checks
        if runtimes.check("ort").ok:
            assert checks["ONNX Runtime (recompile backend)"].ok
            assert "CPUExecutionProvider" in checks["ONNX Runtime (recompile backend)"].detail
    finally:
        runtimes.reset()


def test_recompile_says_which_runtimes_a_base_install_left_out_of_the_search(monkeypatch, capsys):
    """A `pip install cuvil-pgc` without extras searched torch's backends alone and said nothing."""
    from cuvil_pgc.cli.recompile import _missing_runtimes_note

    monkeypatch.setitem(sys.modules, "openvino", None)     # import openvino now raises ImportError
    runtimes.reset()
    try:
        left_out = {s.backend for s in runtimes.unusable("cpu")}
        assert "openvino" in left_out and "tensorrt" not in left_out      # TensorRT runs on GPUs only
        _missing_runtimes_note("cpu")
        out = " ".join(capsys.readouterr().out.split())
        assert "not in the search" in out and "OpenVINO (openvino is not importable" in out
        assert "pip install 'cuvil-pgc[openvino]'" in out and "Torch-TensorRT" not in out     # a GPU runtime
        assert "openvino" not in {s.backend for s in runtimes.unusable("cuda")}      # a CPU runtime
    finally:
        runtimes.reset()


# -- regions on a runtime ---------------------------------------------------------------------------
@pytest.mark.slow   # one ONNX export (~5-20 s on a shared 2-core machine)
@needs_ort
@needs_ov
def test_runtime_regions_return_the_original_structure_and_fall_back_for_other_shapes():
    torch.manual_seed(0)
    model, x = Structured().eval(), torch.randn(3, 16)
    inputs = ScopeInputs((x,))
    with torch.no_grad():
        ref = model(x)
    for cand in (Candidate("", "ort"), Candidate("", "openvino"), Candidate("", "ort", knobs=(("opt", "basic"),))):
        region = realize(model, cand, inputs, machine="t").module
        with torch.no_grad():
            out = region(x)
        assert set(out) == {"out", "nothing", "pair"} and out["nothing"] is None and out["pair"][1] == 3
        torch.testing.assert_close(out["out"], ref["out"], rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(out["pair"][0], ref["pair"][0], rtol=1e-4, atol=1e-5)
        # a call the export was not made for runs the original module
        with torch.no_grad():
            other = region(torch.randn(5, 16))
        assert other["out"].shape == (5, 4) and region.fallback_calls == 1
    # the second ORT candidate reused the first one's export from the artifact cache
    assert len(list((Path(os.environ["CUVIL_CACHE_DIR"]) / "artifacts").glob("*.onnx"))) == 1


class SmallAndLarge(nn.Module):
    """A small input (token ids, 256 bytes) and a large one (a 1x3x96x96 image, 110 KB)."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.conv = nn.Embedding(50, 3), nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, ids: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        return self.conv(image) + self.emb(ids).sum(1)[:, :, None, None]


@needs_ov
def test_openvino_copies_small_inputs_into_its_buffers_and_shares_large_ones_every_call():
    """Small inputs are copied into the infer request's own buffers (binding new memory each call
    costs more than the copy), large ones shared; either way each call reads that call's inputs,
    and an earlier call's output is not overwritten by the next."""
    from cuvil_pgc.recompile.openvino_runner import openvino_input_buffers

    torch.manual_seed(0)
    model = SmallAndLarge().eval()
    ids, image = torch.randint(0, 50, (1, 32)), torch.randn(1, 3, 96, 96)
    region = realize(model, Candidate("", "openvino"), ScopeInputs((ids, image)), machine="t").module
    runner = region.compiled
    small, large = openvino_input_buffers(runner.request, runner.compiled)
    assert small is not None and small.nbytes == 256 and large is None
    calls = [(torch.randint(0, 50, (1, 32)), torch.randn(1, 3, 96, 96)) for _ in range(3)]
    with torch.no_grad():
        outputs = [region(*c) for c in calls]
        assert region._lean is not None and region.fallback_calls == 0
        for (i, x), out in zip(calls, outputs, strict=True):
            torch.testing.assert_close(out, model(i, x), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(runner.run([ids, image])[0], model(ids, image), rtol=1e-4, atol=1e-4)


@needs_ort
@needs_ov
@pytest.mark.parametrize("backend", ["ort", "openvino"])
def test_a_region_called_from_several_threads_at_once_answers_each_call_with_its_own_inputs(backend):
    """A service calls its model from a pool of threads. OpenVINO's one infer request, whose input
    buffers every call copies into, serves one call at a time; ONNX Runtime's session runs calls
    side by side. Either way each thread gets the answer to its own inputs."""
    import threading

    torch.manual_seed(0)
    model = SmallAndLarge().eval()
    region = realize(model, Candidate("", backend), ScopeInputs((torch.randint(0, 50, (1, 32)),
                                                                 torch.randn(1, 3, 96, 96))), machine="t").module
    calls = [[(torch.randint(0, 50, (1, 32)), torch.randn(1, 3, 96, 96)) for _ in range(40)] for _ in range(4)]
    with torch.no_grad():
        wanted = [[model(*c) for c in thread] for thread in calls]
    got: list[list[torch.Tensor]] = [[] for _ in calls]
    start = threading.Barrier(len(calls))

    def serve(i: int) -> None:
        start.wait()
        with torch.no_grad():
            got[i].extend(region(*c) for c in calls[i])
    threads = [threading.Thread(target=serve, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert region.fallback_calls == 0 and [len(g) for g in got] == [40] * 4
    for mine, want in zip(got, wanted, strict=True):
        for out, ref in zip(mine, want, strict=True):
            torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)


@needs_ov
def test_an_openvino_region_of_a_bf16_model_takes_and_returns_bf16():
    """A model cast to bf16 whole (``model.to(torch.bfloat16)``): NumPy holds bf16 as raw 16-bit
    words, and OpenVINO refused them as u16 for its bf16 input, so no OpenVINO candidate built."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 8)).to(torch.bfloat16).eval()
    x = torch.randn(4, 32, dtype=torch.bfloat16)
    region = realize(model, Candidate("", "openvino"), ScopeInputs((x,)), machine="t").module
    with torch.no_grad():
        for other in (x, torch.randn(4, 32, dtype=torch.bfloat16)):
            out = region(other)
            assert out.dtype == torch.bfloat16
            torch.testing.assert_close(out.float(), model(other).float(), rtol=2e-2, atol=2e-2)
    assert region.fallback_calls == 0


def counted_region(backend: str):
    """(model, its captured input, its whole-model region on ``backend``, the list each call of
    the region's ``forward`` (the checked path) appends to)."""
    torch.manual_seed(0)
    model, x = Structured().eval(), torch.randn(3, 16)
    region = realize(model, Candidate("", backend), ScopeInputs((x,)), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(1) or real_forward(*a, **k)
    return model, x, region, forwards


@needs_ort
def test_the_lean_ort_call_matches_the_checked_one_and_steps_aside_for_hooks_and_other_inputs(monkeypatch):
    """An ORT region called with its captured CPU inputs goes straight to the session's compiled
    run (not through ``forward``, nor the Python ``InferenceSession.run`` and its re-checks); hooks,
    other shapes, non-contiguous inputs and inputs that need grad take the checked path, with the
    same results (other strides copied into the captured ones: the checked path runs the program)."""
    import onnxruntime as ort

    python_runs = []
    python_run = ort.InferenceSession.run
    monkeypatch.setattr(ort.InferenceSession, "run", lambda self, *a, **k: python_runs.append(1) or python_run(self, *a, **k))
    model, x, region, forwards = counted_region("ort")
    with torch.no_grad():
        ref = model(x)
        python_runs.clear()
        lean = region(x)
        assert forwards == [] and python_runs == []               # the lean call, on the compiled run
        torch.testing.assert_close(lean["out"], ref["out"], rtol=1e-4, atol=1e-5)
        assert lean["nothing"] is None and lean["pair"][1] == 3
        seen = []
        handle = region.register_forward_hook(lambda mod, args, out: seen.append(out))
        region(x)
        handle.remove()
        assert len(seen) == 1 and forwards == [1]                 # a hook: nn.Module's dispatch
        handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(out))
        region(x)
        handle.remove()
        assert len(seen) >= 2 and forwards == [1, 1]              # a global hook: the same
        region(x)
        assert forwards == [1, 1]                                 # hooks removed: the lean call again
        del forwards[1:]
        strided = torch.randn(16, 3).t()                          # same shape, not contiguous
        torch.testing.assert_close(region(strided)["out"], model(strided)["out"], rtol=1e-4, atol=1e-5)
        assert len(forwards) == 2 and region.fallback_calls == 0  # other strides: copied, the program
        assert region(torch.randn(5, 16))["out"].shape == (5, 4) and region.fallback_calls == 1
    grad = x.clone().requires_grad_()
    out = region(grad)                                            # needs grad: not the NumPy path
    assert len(forwards) == 4 and out["out"].shape == (3, 4)


@needs_ort
def test_a_hook_registered_before_the_region_was_built_is_run_until_removed():
    """The lean call compares torch's hook-handle counter only: a global hook or one on the region
    that was already there when the region was built (no handle handed out since) must still send
    calls through nn.Module's dispatch, which runs it; once it is removed, the lean call again."""
    seen = []
    handle = torch.nn.modules.module.register_module_forward_hook(lambda mod, args, out: seen.append(1))
    try:
        model, x, region, forwards = counted_region("ort")
        with torch.no_grad():
            region(x)
            region(x)
        assert forwards == [1, 1] and len(seen) >= 2
    finally:
        handle.remove()
    with torch.no_grad():
        region(x)
    assert forwards == [1, 1]                                     # removed: the lean call
    own = region.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    own_id = torch.utils.hooks.RemovableHandle.next_id
    with torch.no_grad():
        region(x)
    assert forwards == [1, 1, 1] and seen[-1] == "pre"
    own.remove()
    with torch.no_grad():
        region(x)
    assert forwards == [1, 1, 1] and torch.utils.hooks.RemovableHandle.next_id == own_id


@needs_ort
def test_a_region_under_torch_jit_trace_takes_nn_modules_dispatch():
    """torch.jit.trace records a module's call through nn.Module's dispatch (its scope, its
    ``_slow_forward``): the lean call's tracing test sends it there."""
    torch.manual_seed(0)
    model, x = nn.Sequential(nn.Linear(16, 8), nn.ReLU()).eval(), torch.randn(3, 16)
    region = realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t").module
    forwards = []
    real_forward = region.forward
    region.forward = lambda *a, **k: forwards.append(1) or real_forward(*a, **k)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")                   # the tracer warns of the runtime's NumPy arrays
        torch.jit.trace(region, (x,), check_trace=False)
        assert forwards == [1]
        region(x)
    assert forwards == [1]                                # traced no more: the lean call


@needs_ort
def test_a_region_under_torch_compile_takes_nn_modules_dispatch():
    """Dynamo tracing a region's call sees the compile in progress (the hook check's compiling
    test) and takes ``forward``, not the lean call; the result is the same."""
    model, x, region, forwards = counted_region("ort")
    compiled = torch.compile(region, backend="eager")
    with torch.no_grad():
        out = compiled(x)
        ref = model(x)
    assert forwards
    torch.testing.assert_close(out["out"], ref["out"], rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not runtimes.check("openvino").ok, reason="openvino not installed")
def test_the_lean_openvino_call_matches_the_checked_one_and_steps_aside_for_other_inputs():
    """An OpenVINO region called with its captured CPU inputs skips ``forward`` (nn.Module's
    dispatch and the signature check cost ~9% of a tiny BERT's call where it is deployed); other
    shapes and strides take the checked path to the original module."""
    model, x, region, forwards = counted_region("openvino")
    with torch.no_grad():
        ref = model(x)
        lean = region(x)
        assert forwards == []
        torch.testing.assert_close(lean["out"], ref["out"], rtol=1e-4, atol=1e-5)
        assert lean["nothing"] is None and lean["pair"][1] == 3
        again = region(x)                                  # outputs are copies, not the request's buffers
        assert again["out"].data_ptr() != lean["out"].data_ptr()
        strided = torch.randn(16, 3).t()
        torch.testing.assert_close(region(strided)["out"], model(strided)["out"], rtol=1e-4, atol=1e-5)
        assert forwards == [1] and region.fallback_calls == 0     # other strides: copied, the program


def test_the_lean_call_falls_back_to_the_public_run_where_a_session_has_no_compiled_one():
    from cuvil_pgc.recompile.ort_runner import _compiled_run

    class Bare:
        def run(self, names, feeds, options=None):
            return ["public", names, feeds, options]

    class Wrapped(Bare):
        def __init__(self):
            self._sess = type("C", (), {"run": lambda self, n, f, o: ["compiled", n, f, o]})()

    assert _compiled_run(Bare())(["y"], {"x": 1}, None) == ["public", ["y"], {"x": 1}, None]
    assert _compiled_run(Wrapped())(["y"], {"x": 1}, None) == ["compiled", ["y"], {"x": 1}, None]


def test_the_openvino_call_falls_back_to_the_public_infer_where_a_request_has_no_compiled_one():
    from cuvil_pgc.recompile.openvino_runner import _native_infer

    class Public:                                  # not an openvino._pyopenvino.InferRequest
        def infer(self, inputs=None, share_inputs=False, share_outputs=False, *, decode_strings=True):
            return {"a": ("public", inputs, share_outputs, decode_strings)}

    assert list(_native_infer(Public())(Public(), {}, False, True).values()) == [("public", {}, False, True)]
    if runtimes.check("openvino").ok:
        import openvino as ov

        core = ov.Core()
        param = ov.opset8.parameter([2], ov.Type.f32)
        request = core.compile_model(ov.Model([ov.opset8.relu(param)], [param]), "CPU").create_infer_request()
        request.set_input_tensor(0, ov.Tensor(torch.tensor([-1.0, 2.0]).numpy()))
        infer = _native_infer(request)
        assert infer is not request.infer and [a.tolist() for a in infer(request, {}, False, True).values()] == [[0, 2]]


def test_an_openvino_conversion_failure_names_the_operators_it_could_not_convert():
    """Its first line is only a header ('FrontEnd API failed with OpConversionFailure:'), which is
    all a rejected candidate said (an nn.EmbeddingBag's ONNX graph)."""
    from cuvil_pgc.recompile.runtime_build import _why

    message = ("Check 'false' failed at src/frontends/common_translators/src/unconverted_ops_report.cpp:151:\n"
               "FrontEnd API failed with OpConversionFailure:\nModel wasn't fully converted. Failed operations "
               "detailed log:\n-- ReduceSum-18 with a message:\n[ONNX Frontend] Conversion failed for ReduceSum-18\n"
               "Unsupported input type dynamic\n\nSummary:\n-- Conversion is failed for: ReduceSum-18, Slice-18\n")
    assert _why(RuntimeError(message)) == "RuntimeError: Conversion is failed for: ReduceSum-18, Slice-18"
    assert _why(RuntimeError("Exporting a ScriptModule is not supported\nmore")) == \
        "RuntimeError: Exporting a ScriptModule is not supported"


@needs_ov
def test_a_failed_openvino_conversion_leaves_the_root_logger_as_it_was(tmp_path):
    """openvino.convert_model sets the root logger to ERROR and puts it back only when it succeeds:
    after a candidate it could not convert, every later warning of the process (the user's, and the
    one saying why a pinned plan could not be built) went unseen."""
    from openvino.tools.ovc.error import Error

    from cuvil_pgc.recompile.runtime_build import convert_openvino

    (tmp_path / "m.onnx").write_bytes(b"not an onnx model")
    root = logging.getLogger()
    before = (root.level, list(root.filters), list(root.handlers))
    with pytest.raises(Error):
        convert_openvino(tmp_path / "m.onnx", tmp_path / "m.xml")
    assert (root.level, list(root.filters), list(root.handlers)) == before
    assert logging.getLogger("cuvil_pgc.recompile.plan").isEnabledFor(logging.WARNING)


def test_export_error_names_its_exporter():
    assert ExportError("torch.onnx.export failed: boom").exporter == "torch.onnx.export"
    assert exporter_of_reason("ExportError: openvino.convert_model failed: x") == "openvino.convert_model"
    assert exporter_of_reason("ExportError: torch.export failed: y") == "torch.export"


# -- builds -----------------------------------------------------------------------------------------
class TwoPart(nn.Module):
    """An encoder and a head: a mixed plan runs them on different runtimes."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32))
        self.head = Structured()
        self.head.a = nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> dict:
        return self.head(torch.tanh(self.enc(x)))


def two_part(seed: int = 0):
    torch.manual_seed(seed)
    return TwoPart().eval(), (torch.randn(2, 16),)


@pytest.fixture(scope="module")
def mixed_build(tmp_path_factory):
    """A build whose encoder runs on ONNX Runtime and whose head runs on OpenVINO, signed."""
    from cuvil_pgc.recompile import recompile
    from cuvil_pgc.recompile.signing import generate_keypair

    if not (runtimes.check("ort").ok and runtimes.check("openvino").ok):
        pytest.skip("onnxruntime and openvino are needed")
    tmp = tmp_path_factory.mktemp("mixed")
    mp = pytest.MonkeyPatch()
    mp.setenv("CUVIL_CACHE_DIR", str(tmp / "cache"))
    try:
        model, inputs = two_part()
        plan = {"enc": Candidate("enc", "ort"), "head": Candidate("head", "openvino")}
        build = recompile(model, inputs, plan=plan, records=False, rounds=3)
        priv, pub = generate_keypair(tmp / "key")
        path = build.save(tmp / "mixed.cuvilpkg", signing_key=priv)
    finally:
        mp.undo()
    return path, pub, build


@pytest.mark.slow   # two ONNX exports and an OpenVINO conversion (~20-40 s on a shared 2-core machine)
def test_a_mixed_plan_ships_its_runtime_artifacts_signed_and_loads_them(mixed_build):
    from cuvil_pgc.recompile import load_build
    from cuvil_pgc.recompile.package import open_build

    path, pub, build = mixed_build
    with open_build(path, pub) as vb:
        members = vb.members()
        choices = {c["scope"]: c for c in json.loads(vb.read_bytes("plan.json"))["choices"]}
    assert {"ort/0.onnx", "openvino/1.xml", "openvino/1.bin"} <= set(members)   # digests checked by open_build
    assert choices["enc"]["artifact"] == "ort/0.onnx" and choices["head"]["artifact"] == "openvino/1.xml"
    assert choices["enc"]["runtime"]["name"] == "ort" and choices["enc"]["runtime"]["version"] == runtimes.version("ort")
    # the head's structure travels in the plan: two tensors, the None entry and the constant 3
    assert choices["head"]["runtime"]["outputs"]["leaves"] == [["t", 0], ["c", None], ["t", 1], ["c", 3]]
    model, inputs = two_part()
    loaded = load_build(path, model, pubkey=pub)
    assert loaded.cuvil_load_report.runtime_regions == 2
    assert sorted(loaded.cuvil_load_report.applied) == ["enc: ort", "head: openvino"]
    with torch.no_grad():
        out, ref = loaded(*inputs), model(*inputs)
    assert out["nothing"] is None and out["pair"][1] == 3
    torch.testing.assert_close(out["out"], ref["out"], rtol=1e-4, atol=1e-5)
    assert type(loaded.enc).__name__ == "CompiledRegion" and type(loaded.head).__name__ == "CompiledRegion"


@pytest.mark.slow
def test_a_tampered_runtime_artifact_is_refused_before_any_runtime_parses_it(mixed_build, tmp_path, monkeypatch):
    import onnxruntime
    import openvino

    from cuvil_pgc.recompile import load_build
    from tests._buildkit import rezip

    path, pub, _ = mixed_build
    parsed = []
    monkeypatch.setattr(onnxruntime, "InferenceSession", lambda *a, **k: parsed.append(a))
    monkeypatch.setattr(openvino, "Core", lambda *a, **k: parsed.append(a))

    def flip(entries):
        return [(info, data[:-1] + bytes([data[-1] ^ 1]) if info.filename == "ort/0.onnx" else data)
                for info, data in entries]
    bad = rezip(Path(path), tmp_path / "bad.cuvilpkg", flip)
    model, _ = two_part()
    with pytest.raises(BuildError, match="ort/0.onnx"):
        load_build(bad, model, pubkey=pub)
    assert parsed == []


@pytest.mark.slow
def test_load_without_the_runtime_names_the_extra_or_falls_back_to_eager(mixed_build, monkeypatch):
    from cuvil_pgc.recompile import load_build

    path, pub, _ = mixed_build
    real = runtimes.check
    monkeypatch.setattr(runtimes, "check", lambda backend, device="cpu": runtimes.RuntimeStatus(
        backend, False, reason="openvino is not importable (No module named 'openvino')",
        fix=runtimes.RUNTIMES[backend].fix) if backend == "openvino" else real(backend, device))
    model, inputs = two_part()
    with pytest.raises(BuildError, match=r"pip install 'cuvil-pgc\[openvino\]'"):
        load_build(path, model, pubkey=pub)
    with pytest.warns(RuntimeWarning, match="OpenVINO"):
        same = load_build(path, model, pubkey=pub, fallback="eager")
    assert same is model


class Branchy(nn.Module):
    """Data-dependent control flow: no exporter captures it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:
            return torch.relu(self.fc(x))
        return self.fc(x) - 1


@pytest.mark.slow   # a search (its CPU probes) and one failing export
@needs_ort
@needs_ov
def test_a_failed_onnx_export_rejects_every_candidate_through_it_without_building_them(monkeypatch):
    from cuvil_pgc.recompile import runtime_build
    from cuvil_pgc.recompile.search import search
    from cuvil_pgc.recompile.trials import SearchOptions

    exports = []
    real = runtime_build.export_onnx
    monkeypatch.setattr(runtime_build, "export_onnx", lambda *a: (exports.append(a), real(*a)))
    torch.manual_seed(0)
    model, inputs = Branchy().eval(), (torch.ones(2, 8),)
    result = search(model, inputs, None, options=SearchOptions(exhaustive=True, backends=("ort", "openvino"), rounds=3))
    runtime_trials = [t for t in result.trials.values()
                      if t.candidate.backend in ("ort", "openvino") and t.candidate.precision == "fp32"]
    assert len(runtime_trials) >= 3 and all(t.status == "compile_error" for t in runtime_trials)
    first = [t for t in runtime_trials if not t.reason.startswith("not built")]
    assert len(first) == 1 and "torch.onnx.export failed" in first[0].reason and len(exports) == 1
    for t in runtime_trials:
        if t is not first[0]:
            assert t.reason.startswith(f"not built: {first[0].candidate.config} showed that ExportError: "
                                       "torch.onnx.export failed")
    assert result.choices == {}    # eager: nothing else was in the space


# -- TensorRT (through a fake torch_tensorrt at the import seam) ------------------------------------
@pytest.fixture
def fake_tensorrt(monkeypatch):
    from cuvil_pgc.recompile import runtime_build
    from tests.fakes import fake_torch_tensorrt

    fake_torch_tensorrt.calls.clear()
    monkeypatch.setitem(sys.modules, "torch_tensorrt", fake_torch_tensorrt)
    monkeypatch.setattr(runtime_build, "_gpu_name", lambda: "NVIDIA H200")
    runtimes.reset()
    yield fake_torch_tensorrt
    runtimes.reset()


def test_tensorrt_regions_build_through_torch_tensorrt_and_are_tied_to_gpu_and_version(fake_tensorrt, monkeypatch):
    from cuvil_pgc.recompile import runtime_build
    from cuvil_pgc.recompile.realized import Realized

    assert runtimes.check("tensorrt", "cuda").ok and not runtimes.check("tensorrt", "cpu").ok
    torch.manual_seed(0)
    model, x = Structured().eval(), torch.randn(3, 16)
    realized = realize(model, Candidate("", "tensorrt", precision="fp16"), ScopeInputs((x,)), device="cuda")
    call = fake_tensorrt.calls[-1]
    assert call["ir"] == "dynamo" and call["enabled_precisions"] == {torch.float32, torch.float16}
    with torch.no_grad():
        out, ref = realized.module(x), model(x)
    assert out["nothing"] is None and out["pair"][1] == 3
    torch.testing.assert_close(out["out"], ref["out"])
    assert realized.artifact.endswith(".ep")
    info = runtime_build.runtime_info("tensorrt", realized)
    assert info["version"] == "2.9.0+fake" and "gpu" not in info          # the GPU goes into the manifest
    target = runtime_build.engine_target()
    assert (target.gpu, target.version) == ("NVIDIA H200", "2.9.0+fake")
    runtime_build._check_tensorrt(target, "b.cuvilpkg")        # same GPU and version: fine
    monkeypatch.setattr(runtime_build, "_gpu_name", lambda: "NVIDIA A10")
    with pytest.raises(BuildError, match="another GPU or TensorRT.*gpu: built 'NVIDIA H200', here 'NVIDIA A10'"):
        runtime_build._check_tensorrt(target, "b.cuvilpkg")
    assert isinstance(realized, Realized)


def _tensorrt_build(path, model, key, *, plan_format=2, target=None, runtime=None):
    """A signed build whose head runs a TensorRT engine (its bytes would not parse: a loader that
    refuses the build first never reads them)."""
    from cuvil_pgc.recompile.manifest import current_fingerprint
    from cuvil_pgc.recompile.matching import structural_hash
    from cuvil_pgc.recompile.package import BuildWriter

    choice = {"scope": "head", "candidate": Candidate("head", "tensorrt").to_json(), "config": "tensorrt",
              "structure": structural_hash(model.head), "weights": None, "input_signature": None,
              "input_spec": None, "artifact": "tensorrt/0.ep", "runtime": runtime or {"name": "tensorrt"}}
    plan = {"format": plan_format, "device": "cuda", "choices": [choice], "regions": []}
    with BuildWriter(path, "m", 1, fingerprint=current_fingerprint("cuda"), model_hash=structural_hash(model),
                     tensorrt=target) as w:
        w.add_bytes("plan.json", json.dumps(plan).encode())
        w.add_bytes("tensorrt/0.ep", b"not an engine")
        w.close(key)
    return path


def test_a_tensorrt_build_for_another_gpu_or_version_is_refused_before_its_engine_is_read(
        fake_tensorrt, monkeypatch, tmp_path):
    """The manifest ties the engines to their GPU and TensorRT version (older builds: plan.json's
    runtime record); load_build refuses another one before the model moves or an engine is parsed."""
    from cuvil_pgc.recompile import load_build, runtime_build
    from cuvil_pgc.recompile.manifest import EngineTarget
    from cuvil_pgc.recompile.package import open_build
    from cuvil_pgc.recompile.signing import generate_keypair

    loads = []
    monkeypatch.setattr(fake_tensorrt, "load", lambda *a, **k: loads.append(a))
    priv, pub = generate_keypair(tmp_path / "key")
    model, _ = two_part()
    a10 = _tensorrt_build(tmp_path / "a10.cuvilpkg", model, priv,
                          target=EngineTarget(version="2.9.0+fake", gpu="NVIDIA A10"))
    with open_build(a10, pub) as vb:
        assert vb.manifest.tensorrt == EngineTarget(version="2.9.0+fake", gpu="NVIDIA A10")
    with pytest.raises(BuildError, match="another GPU or TensorRT.*gpu: built 'NVIDIA A10', here 'NVIDIA H200'"):
        load_build(a10, model, pubkey=pub)
    older_trt = _tensorrt_build(tmp_path / "v1.cuvilpkg", model, priv,
                                target=EngineTarget(version="2.8.0", gpu="NVIDIA H200"))
    with pytest.raises(BuildError, match="version: built '2.8.0', here '2.9.0\\+fake'"):
        load_build(older_trt, model, pubkey=pub)
    # a build of plan format 1 has no manifest entry: the choice's runtime record is checked
    format_1 = _tensorrt_build(tmp_path / "f1.cuvilpkg", model, priv, plan_format=1,
                               runtime={"name": "tensorrt", "version": "2.9.0+fake", "gpu": "NVIDIA A10"})
    with pytest.raises(BuildError, match="gpu: built 'NVIDIA A10', here 'NVIDIA H200'"):
        load_build(format_1, model, pubkey=pub)
    assert loads == []
    # the same GPU and version pass the check (what follows needs a GPU)
    with open_build(_tensorrt_build(tmp_path / "ok.cuvilpkg", model, priv, target=runtime_build.engine_target()),
                    pub) as vb:
        from cuvil_pgc.recompile.load import _read_plan

        runtime_build.check_engines(vb.manifest, _read_plan(vb, vb.path), vb.path)


@needs_ort
def test_ort_on_cuda_uses_the_cuda_and_tensorrt_providers(monkeypatch, tmp_path):
    """The execution provider knob picks ONNX Runtime's providers (a fake session records them)."""
    from cuvil_pgc.recompile import ort_runner

    seen = {}

    class FakeSession:
        def __init__(self, path, options, providers):
            seen["providers"], seen["threads"] = providers, options.intra_op_num_threads

        def get_inputs(self):
            return []

        def get_outputs(self):
            return []

    import onnxruntime

    monkeypatch.setattr(onnxruntime, "InferenceSession", FakeSession)
    monkeypatch.setattr(onnxruntime, "get_available_providers",      # onnxruntime-gpu's
                        lambda: ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"])
    ort_runner.OrtRunner(str(tmp_path / "m.onnx"), {"ep": "tensorrt", "threads": "3"}, None)
    assert seen == {"providers": ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"],
                    "threads": 3}


def test_a_build_choosing_a_configuration_with_unknown_fields_is_refused_not_silently_changed(tmp_path):
    """A newer cuvil-pgc's knob must not vanish on load (Candidate.from_json would drop it)."""
    from cuvil_pgc.recompile import load_build
    from cuvil_pgc.recompile.manifest import current_fingerprint
    from cuvil_pgc.recompile.matching import structural_hash
    from cuvil_pgc.recompile.package import BuildWriter
    from cuvil_pgc.recompile.signing import generate_keypair

    model, _ = two_part()
    cand = {**Candidate("enc", "ort").to_json(), "graph_capture": True}
    plan = {"format": 1, "device": "cpu", "regions": [], "choices": [
        {"scope": "enc", "candidate": cand, "config": "ort", "structure": structural_hash(model.enc),
         "weights": None, "input_signature": None, "input_spec": None, "artifact": "ort/0.onnx"}]}
    priv, pub = generate_keypair(tmp_path / "key")
    path = tmp_path / "newer.cuvilpkg"
    with BuildWriter(path, "m", 1, fingerprint=current_fingerprint("cpu"), model_hash=structural_hash(model)) as w:
        w.add_bytes("plan.json", json.dumps(plan).encode())
        w.add_bytes("ort/0.onnx", b"not parsed")
        w.close(priv)
    with pytest.raises(BuildError, match="fields this cuvil-pgc does not know \\(graph_capture\\)"):
        load_build(path, model, pubkey=pub)
    assert Candidate.unknown_fields(Candidate("x").to_json()) == []


# -- knobs and the cost models ----------------------------------------------------------------------
@needs_ort
def test_knobs_become_the_runtimes_own_options():
    import onnxruntime as ort

    from cuvil_pgc.recompile.openvino_runner import openvino_config
    from cuvil_pgc.recompile.ort_runner import ort_session_options

    so = ort_session_options(ort, {"opt": "basic", "exec": "parallel", "threads": "2", "spin": "off"})
    assert so.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_mode == ort.ExecutionMode.ORT_PARALLEL and so.intra_op_num_threads == 2
    assert so.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    default = ort_session_options(ort, {})
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert default.intra_op_num_threads == torch.get_num_threads()     # the deployment's threads
    assert openvino_config({}, "fp32") == {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_PRECISION_HINT": "f32",
                                           "INFERENCE_NUM_THREADS": str(torch.get_num_threads()),
                                           "ENABLE_CPU_PINNING": "NO"}     # a busy pinned core stalls every call
    assert openvino_config({"pin": "on"}, "fp32")["ENABLE_CPU_PINNING"] == "YES"
    assert openvino_config({"hint": "throughput", "threads": "4"}, "bf16")["INFERENCE_PRECISION_HINT"] == "bf16"


@needs_ort
def test_an_ort_region_inside_the_model_stops_spinning_when_its_run_returns():
    """Its intra-op threads spun on between runs while the torch code around the region ran on the
    same cores: a ViT with one layer on ONNX Runtime at 2 threads ran up to 2.8x slower than eager."""
    import onnxruntime as ort

    from cuvil_pgc.recompile.ort_runner import measuring_in_process, ort_session_options
    from cuvil_pgc.recompile.runtime_build import knobs_of

    assert knobs_of(Candidate("encoder.layer.0", "ort")) == {"spin": "run"}
    assert knobs_of(Candidate("encoder", "ort", knobs=(("spin", "off"),))) == {"spin": "off"}
    assert knobs_of(Candidate("", "ort")) == {} and knobs_of(Candidate("encoder", "openvino")) == {}
    stop = "session.force_spinning_stop"
    run = ort_session_options(ort, {"spin": "run"})
    assert run.get_session_config_entry(stop) == "1"
    assert run.get_session_config_entry("session.intra_op.allow_spinning") == "1"    # within a run it spins
    with pytest.raises(RuntimeError, match="does not have configuration"):     # a whole model spins on
        ort_session_options(ort, {}).get_session_config_entry(stop)
    with measuring_in_process():       # the searching process: no session spins between its runs
        assert ort_session_options(ort, {}).get_session_config_entry(stop) == "1"
        with pytest.raises(RuntimeError, match="does not have configuration"):
            ort_session_options(ort, {"spin": "off"}).get_session_config_entry(stop)


@pytest.mark.slow   # exports the probe to ONNX
@needs_ort
def test_calibration_measures_each_runtimes_fixed_cost_and_the_cost_model_learns_it(tmp_path, monkeypatch):
    from cuvil_pgc.recompile import calibrate
    from cuvil_pgc.recompile.cost_models import PRIORS, MachineFigures, PlanCostModel
    from cuvil_pgc.recompile.records import RecordDB
    from cuvil_pgc.recompile.search_records import refit_sample

    monkeypatch.setattr(calibrate, "PROBE_CONFIGS", (Candidate(""),))          # eager only, no compiles
    monkeypatch.setattr(calibrate.runtimes, "available", lambda device="cpu": ("ort",))
    db = RecordDB(tmp_path / "records")
    assert calibrate.calibrate_backends(db, "m", rounds=5) == 2
    samples = [s for s in (refit_sample(r) for r in db.for_machine("m")) if s is not None]
    assert {c.backend for c, _, _ in samples} == {"eager", "ort"}
    model = PlanCostModel(MachineFigures())
    model.refit(samples)
    ort_us = next(m for c, f, m in samples if c.backend == "ort")
    assert model.overhead.fixed_us["ort"] != PRIORS["fixed_us"]["ort"]    # moved towards this machine's probe
    assert calibrate.calibrate_backends(db, "m", rounds=5) == 0 and ort_us > 0   # once per machine


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn, self.fc = nn.GRU(8, 8, batch_first=True), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out, h = self.rnn(x)
        return self.fc(out), h


@pytest.mark.slow   # one ONNX export of an unrolled GRU
@needs_ort
def test_module_rewrites_apply_before_the_export():
    torch.manual_seed(0)
    model, x = Tagger().eval(), torch.randn(1, 4, 8)
    realized = realize(model, Candidate("", "ort", rewrite=True), ScopeInputs((x,)), machine="t")
    assert realized.rewrites == ["gru_cell:rnn"] and realized.artifact.endswith(".onnx")
    import onnx

    ops = {n.op_type for n in onnx.load(realized.artifact).graph.node}
    assert "GRU" not in ops         # the exported program is the rewritten cells, not ONNX's GRU op
    with torch.no_grad():
        out, ref = realized.module(x), model(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


# -- the search -------------------------------------------------------------------------------------
class Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.mark.slow   # a search with its CPU probes and final race
@needs_ort
@needs_ov
def test_the_search_measures_the_whole_model_on_each_runtime_at_its_defaults_first(monkeypatch):
    """What a user would deploy instead of a build is always measured and raced, whatever the cost
    models predict (builds are faked at the seam: every candidate runs the eager module)."""
    from cuvil_pgc.recompile import search as search_mod

    built = _faked_builds(monkeypatch)
    torch.manual_seed(0)
    result = search_mod.search(Mlp().eval(), (torch.randn(2, 16),), None,
                               options=SearchOptions(budget=5, backends=("aoti", "ort", "openvino"),
                                                                rounds=3))
    assert set(built[:2]) == {"<model>::ort", "<model>::openvino"}
    assert all(result.trials[k].status == "ok" for k in ("<model>::ort", "<model>::openvino"))
    assert len(built) > 2 and result.measured <= 5    # the budget still holds, with room for others


def _faked_builds(monkeypatch) -> list[str]:
    """Builds faked at the seam (every candidate runs the eager module); the keys built, in order."""
    from cuvil_pgc.recompile import plan as plan_mod
    from cuvil_pgc.recompile.realized import Realized

    built: list[str] = []

    def fake_realize(module, cand, inputs, **kw):
        built.append(cand.key)
        return Realized(module)

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", fake_realize)
    monkeypatch.setattr(plan_mod, "realize", lambda module, cand, inputs, **kw: Realized(module))
    return built


@pytest.mark.slow   # searches with their CPU probes and final races
@needs_ort
@needs_ov
@pytest.mark.parametrize("native", [True, False])
def test_openvino_in_bf16_is_a_runtime_default_where_the_cpu_runs_it_and_the_guard_decides(monkeypatch, native):
    """On CPUs with AVX512-BF16/AMX, OpenVINO's own default precision is bf16: it is measured as a
    baseline beside fp32 whatever the tolerances, because its plugin keeps outputs and sensitive
    layers in f32 (the rounded-outputs filter that keeps autocast bf16 out does not apply); the
    guard decides on its outputs. Autocast bf16 stays out under the default guard."""
    from cuvil_pgc.recompile import plan as plan_mod
    from cuvil_pgc.recompile import runtimes
    from cuvil_pgc.recompile import search as search_mod
    from cuvil_pgc.recompile.realized import Realized

    built: list[str] = []

    class Rounded(nn.Module):      # what a bf16 program would return if it rounded its outputs
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, *args):
            return self.inner(*args).to(torch.bfloat16).float()

    def fake_realize(module, cand, inputs, **kw):
        built.append(cand.key)
        return Realized(Rounded(module) if cand.precision == "bf16" else module)

    monkeypatch.setattr("cuvil_pgc.recompile.checked_build.realize", fake_realize)
    monkeypatch.setattr(plan_mod, "realize", fake_realize)      # the final plans: no AOTInductor compile
    monkeypatch.setattr(runtimes, "openvino_native_bf16", lambda: native)
    bf16 = "<model>::openvino+bf16"
    for rtol, passes in ((None, False), (2e-2, True)):
        built.clear()
        torch.manual_seed(0)
        result = search_mod.search(Mlp().eval(), (torch.randn(2, 16),), None, options=SearchOptions(
            budget=3, backends=("aoti", "ort", "openvino"), rounds=3, rtol=rtol, atol=rtol, deployed_race=False))
        assert (bf16 in built[:3]) is native, (rtol, built)
        assert "<model>::openvino" in built[:3]
        if rtol is None:        # autocast bf16 rounds its outputs: filtered out at fp32 tolerances
            assert not any(key.endswith("bf16") and "openvino" not in key for key in built), built
        defaults = {t.candidate.key: t for t in result.runtime_defaults}
        assert (bf16 in defaults) is native
        if native:
            assert (defaults[bf16].status == "ok") is passes, defaults[bf16]


def test_an_output_nested_deeper_than_the_parser_takes_is_built_by_the_pytree():
    from cuvil_pgc.recompile.output_template import OutputTemplate

    out = torch.ones(1)
    for _ in range(400):
        out = (out, None)
    template = OutputTemplate.of(out)
    assert template._flat is None
    built = template.build([torch.zeros(1)])
    for _ in range(400):
        built = built[0]
    assert torch.equal(built, torch.zeros(1))


def test_output_template_shortcuts_build_what_the_pytree_builds():
    """One tensor, a flat tuple of tensors, and dicts, tuples, lists, namedtuples and OrderedDicts of
    tensors and constants, nested, are built without the pytree; every shape of output comes back as
    the pytree would build it."""
    from collections import OrderedDict, defaultdict, namedtuple

    from torch.utils import _pytree as pytree

    from cuvil_pgc.recompile.output_template import OutputTemplate

    a, b = torch.ones(1), torch.ones(2)
    pair = namedtuple("pair", "x y")
    for out, direct in ((a, True), ((a, b), True), ((a, None), True), ({"x": a}, True), ([a], True),
                        ({"logits": b, "aux": None, "mean": a, "n": 3}, True), ((b, a), True),
                        ((a, (b,)), True), ({"x": [a]}, True), ((a, (b, a), [None, {"k": b, 2: "s"}]), True),
                        (pair(a, b), True), (OrderedDict(x=a, y=(b, 1)), True), ((a, pair(a, (b, None))), True),
                        (OrderedDict(), True), (defaultdict(list, x=[a]), False)):
        template = OutputTemplate.of(out)
        assert (template.is_single or template._tuple or template._flat is not None) is direct, out
        fresh = [torch.zeros_like(t) for t in pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]
        built = template.build(fresh)
        assert type(built) is type(out) and pytree.tree_structure(built) == pytree.tree_structure(out)
        assert repr(built) == repr(template._unflatten(fresh))
        assert [t.shape for t in pytree.tree_leaves(built) if isinstance(t, torch.Tensor)] == [t.shape for t in fresh]
