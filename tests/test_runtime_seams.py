"""Runtime paths this machine cannot run, tested through fakes at their seams: ONNX Runtime's CUDA
IO binding (a fake session), and doctor's list of runtime checks."""

from __future__ import annotations

import ctypes

import pytest
import torch

from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile.ort_runner import OrtRunner
from cuvil_pgc.recompile.output_template import OutputTemplate

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


class FakeBinding:
    def __init__(self) -> None:
        self.inputs: dict[str, tuple] = {}
        self.outputs: dict[str, tuple] = {}

    def bind_input(self, name, device_type, device_id, element_type, shape, buffer_ptr):
        self.inputs[name] = (device_type, device_id, element_type, shape, buffer_ptr)

    def bind_output(self, name, device_type, device_id=0, element_type=None, shape=None, buffer_ptr=None):
        self.outputs[name] = (device_type, device_id, element_type, shape, buffer_ptr)

    def get_outputs(self):
        """The outputs ONNX Runtime allocated (an unbound buffer): the index check's count."""
        import numpy as np

        return [type("V", (), {"numpy": lambda _, n=FakeSession.out_of_range: np.array(n)})()
                for name, bound in self.outputs.items() if bound[4] is None]


class FakeSession:
    """Two inputs, two outputs: ``sum = a + b`` is faked by copying a's bytes into ``sum`` and b's
    into ``copy``, writing straight into the bound output buffers as ONNX Runtime does."""

    runs: list[FakeBinding] = []
    #: the outputs after the two: the index check's count (see onnx_index_checks)
    extra_outputs: tuple[str, ...] = ()
    out_of_range = 0

    def __init__(self, path, options, providers):
        self.providers = providers

    def get_inputs(self):
        return [type("I", (), {"name": n}) for n in ("a", "b")]

    def get_outputs(self):
        return [type("O", (), {"name": n}) for n in ("first", "second", *self.extra_outputs)]

    def io_binding(self):
        return FakeBinding()

    def run(self, *a, **k):
        raise AssertionError("the bound path must not call run()")

    def run_with_iobinding(self, binding, run_options=None):
        FakeSession.runs.append(binding)
        for src, dst in (("a", "first"), ("b", "second")):
            *_, element_type, shape, ptr = binding.inputs[src]
            nbytes = int(torch.Size(shape).numel()) * element_type.itemsize
            ctypes.memmove(binding.outputs[dst][4], ptr, nbytes)


@needs_ort
def test_cuda_regions_run_through_io_binding_into_torch_tensors(monkeypatch):
    import numpy as np
    import onnxruntime

    monkeypatch.setattr(onnxruntime, "InferenceSession", FakeSession)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    FakeSession.runs = []
    a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.arange(4, dtype=torch.int64)
    template = OutputTemplate.of({"x": a.clone(), "rest": (None, b.clone())})
    runner = OrtRunner("m.onnx", {"ep": "cuda"}, template)
    assert runner.session.providers == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    out = runner._run_bound([a, b])
    binding = FakeSession.runs[-1]
    assert binding.inputs["a"] == ("cpu", 0, np.dtype("float32"), (2, 3), a.data_ptr())   # bound in place
    assert binding.outputs["second"][2:4] == (np.dtype("int64"), (4,))
    assert [o.data_ptr() for o in out] == [binding.outputs[n][4] for n in ("first", "second")]  # no copy out
    torch.testing.assert_close(out[0], a)
    torch.testing.assert_close(out[1], b)
    # the runner's call routes tensors off the CPU to the bound path and restores the structure
    monkeypatch.setattr(runner, "_run_bound", lambda inputs: [a * 2, b])
    result = runner(torch.empty(2, 3, device="meta"), torch.empty(4, dtype=torch.int64, device="meta"))
    assert result["rest"][0] is None
    torch.testing.assert_close(result["x"], a * 2)


@needs_ort
def test_a_cuda_region_whose_program_checks_its_indices_reads_the_count_after_the_bound_run(monkeypatch):
    import onnxruntime

    from cuvil_pgc.recompile.onnx_index_checks import CHECK_OUTPUT, IndexCheckFailed

    monkeypatch.setattr(onnxruntime, "InferenceSession", FakeSession)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    monkeypatch.setattr(FakeSession, "extra_outputs", (CHECK_OUTPUT,))
    a, b = torch.arange(6, dtype=torch.float32).reshape(2, 3), torch.arange(4, dtype=torch.int64)
    runner = OrtRunner("m.onnx", {"ep": "cuda"}, OutputTemplate.of((a.clone(), b.clone())))
    assert runner.checks_indices
    out = runner._run_bound([a, b])
    assert FakeSession.runs[-1].outputs[CHECK_OUTPUT][0] == "cpu"      # the count comes back to the host
    torch.testing.assert_close(out[0], a)
    monkeypatch.setattr(FakeSession, "out_of_range", 2)
    with pytest.raises(IndexCheckFailed):
        runner._run_bound([a, b])


def test_doctor_checks_every_runtime_backend():
    """A runtime the doctor command does not check (or a new one never added) fails here."""
    from cuvil_pgc.cli.doctor import all_checks
    from cuvil_pgc.instrument import doctor

    checks = all_checks()
    names = [c.__name__ for c in checks]
    for backend in runtimes.RUNTIME_BACKENDS:
        assert f"check_{backend}" in names, f"cuvil-pgc doctor does not list the {backend} runtime"
    runtime_checks = [c for c in checks if c.__name__.removeprefix("check_") in runtimes.RUNTIME_BACKENDS]
    reported = {r.name for r in doctor.run_checks(runtime_checks)}
    assert reported == {f"{r.title} (recompile backend)" for r in runtimes.RUNTIMES.values()}
