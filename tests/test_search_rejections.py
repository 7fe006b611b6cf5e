"""What a failed build shows of its siblings (search_rejections.Rejections), without a search."""

from __future__ import annotations

import math

from cuvil_pgc.recompile.accuracy import AccuracyResult
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.checked_build import CheckedBuild
from cuvil_pgc.recompile.search_rejections import Rejections

ORT = Candidate("body", "ort")
ONNX_EXPORT_FAILED = CheckedBuild("compile_error", reason="ExportError: torch.onnx.export failed: boom",
                                  export_failed=True)


def test_an_exporter_that_failed_rejects_every_candidate_of_the_scope_through_it_and_no_other():
    r = Rejections()
    r.learn(ORT, ONNX_EXPORT_FAILED)
    status, why = r.why_not_built(Candidate("body", "ort", knobs=(("threads", "2"),)))
    assert status == "compile_error" and "torch.onnx.export failed: boom" in why
    assert r.why_not_built(Candidate("body", "openvino")) is not None     # exports through ONNX first
    assert r.why_not_built(Candidate("body", "aoti")) is None             # torch.export: another exporter
    assert r.why_not_built(Candidate("body", "ort", rewrite=True)) is None    # another module is exported
    assert r.why_not_built(Candidate("head", "ort")) is None


def _failed(excess: float, max_abs_err: float = 0.1) -> CheckedBuild:
    return CheckedBuild("accuracy_error", reason="max abs err", check=AccuracyResult(
        ok=False, reason="max abs err", max_abs_err=max_abs_err, ref_scale=1.0, excess=excess))


def test_a_decisive_accuracy_failure_rejects_the_knobs_that_only_schedule_the_same_arithmetic():
    r = Rejections()
    bf16 = Candidate("body", "openvino", precision="bf16")
    r.learn(bf16, _failed(excess=50.0))
    status, why = r.why_not_built(Candidate("body", "openvino", precision="bf16", knobs=(("hint", "throughput"),)))
    assert status == "accuracy_error" and "50x its tolerance" in why
    assert r.why_not_built(Candidate("body", "openvino")) is None          # fp32: other arithmetic


def test_a_narrow_failure_or_garbage_outputs_teach_nothing_about_siblings():
    r = Rejections()
    bf16 = Candidate("body", "openvino", precision="bf16")
    r.learn(bf16, _failed(excess=2.0))                        # rounding another schedule may pass
    r.learn(bf16, _failed(excess=math.inf, max_abs_err=math.inf))    # a fault, not the arithmetic
    assert r.why_not_built(Candidate("body", "openvino", precision="bf16", knobs=(("threads", "1"),))) is None


def test_a_build_that_ran_the_original_module_rejects_every_build_of_its_scope():
    r = Rejections()
    r.learn(ORT, CheckedBuild("runs_original", reason="the build runs the original module here: a hook"))
    assert r.why_not_built(Candidate("body", "compile")) == (
        "runs_original", "the build runs the original module here: a hook")
    assert r.why_not_built(Candidate("head", "compile")) is None


def test_a_decoding_call_builds_only_what_runs_other_sizes():
    r = Rejections(sizes_vary=True)
    status, why = r.why_not_built(Candidate("", "compile"))
    assert status == "not_measured" and "runs only its captured sizes" in why
    assert r.why_not_built(Candidate("", "eager")) is None
    assert Rejections().why_not_built(Candidate("", "compile")) is None
