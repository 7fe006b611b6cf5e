"""The typed Plan (plan.json): round trips keep a newer version's fields, format 1 still reads, and
the build, the loader, the report and the CLI all take the Plan."""

from __future__ import annotations

import json

import pytest

from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.plan_doc import (
    PLAN_FORMAT,
    READ_FORMATS,
    Plan,
    PlanChoice,
    PlanFormatError,
    PlanRegion,
)

#: a plan.json as cuvil-pgc 0.x wrote it (format 1): the TensorRT choice records GPU and version
FORMAT_1 = {
    "format": 1, "device": "cpu", "machine": "m1", "model_hash": "ab" * 32,
    "tolerances": {"rtol": None, "atol": None},
    "choices": [{"scope": "enc", "candidate": Candidate("enc", "ort", knobs=(("opt", "extended"),)).to_json(),
                 "config": "ort+opt=extended", "structure": "s1", "weights": "w1", "input_signature": [[2, 16]],
                 "input_spec": None, "artifact": "ort/0.onnx",
                 "runtime": {"name": "ort", "version": "1.32.0", "outputs": None}},
                {"scope": "head", "candidate": Candidate("head", "tensorrt").to_json(), "config": "tensorrt",
                 "structure": "s2", "weights": None, "input_signature": None, "input_spec": None,
                 "artifact": "tensorrt/1.ep",
                 "runtime": {"name": "tensorrt", "version": "2.9.0", "gpu": "NVIDIA H200", "outputs": None}}],
    "regions": [{"path": "model", "scope": "<model>", "chosen": "eager", "bottleneck": "host_bound",
                 "labels": ["host_bound"], "evidence": {"ops_per_forward": 3}, "predicted_ms": None,
                 "measured_ms": 2.0, "baseline_ms": 2.4,
                 "alternatives": [{"config": "aoti", "status": "ok"}, {"config": "x", "status": "compile_error"},
                                  {"config": "y", "status": "not_measured"}]}],
    "stale": [{"path": "gone", "reason": "module changed"}], "unmatched": ["a/b"],
    "measured_candidates": 7, "reused_records": 1, "space_size": 24, "baseline_ms": 2.4, "plan_ms": 2.0,
    "speedup_vs_eager": 1.2, "final_medians_ms": {"eager": 2.4, "model": 2.0},
}


def test_format_1_reads_into_the_typed_plan():
    plan = Plan.from_json(json.loads(json.dumps(FORMAT_1)))
    assert plan.format == 1 and plan.device == "cpu" and plan.measured_candidates == 7
    enc, head = plan.choices
    assert isinstance(enc, PlanChoice) and enc.candidate == Candidate("enc", "ort", knobs=(("opt", "extended"),))
    assert enc.config == "ort+opt=extended" and enc.artifact == "ort/0.onnx" and enc.input_signature == [[2, 16]]
    assert head.runtime["gpu"] == "NVIDIA H200"          # where format 1 kept the engine's GPU
    region = plan.regions[0]
    assert isinstance(region, PlanRegion) and region.tried_counts() == (2, 1)
    assert plan.candidates() == {"enc": enc.candidate, "head": head.candidate}
    assert plan.runtime_defaults == [] and plan.extra == {}
    out = plan.to_json()
    assert out["format"] == PLAN_FORMAT == 2          # written back in the current format
    assert out["choices"] == FORMAT_1["choices"] and out["regions"][0] == FORMAT_1["regions"][0]


def test_a_newer_plans_unknown_fields_survive_a_round_trip_at_every_level():
    newer = json.loads(json.dumps(FORMAT_1))
    newer["format"], newer["runtime_defaults"] = 2, [{"config": "ort", "status": "ok", "measured_ms": 1.0}]
    newer["calibration"] = {"probe": "v3"}                          # plan level
    newer["choices"][0]["graph_capture_stats"] = [1, 2]             # choice level
    newer["choices"][0]["candidate"]["graph_capture"] = True        # the candidate's own knob
    newer["regions"][0]["energy_j"] = 0.4                           # region level
    plan = Plan.from_json(newer)
    assert plan.extra == {"calibration": {"probe": "v3"}}
    # the newer version's config spelling is kept beside its field
    assert plan.choices[0].extra == {"graph_capture_stats": [1, 2], "config": "ort+opt=extended"}
    assert plan.choices[0].candidate.unknown == ["graph_capture"]
    assert "graph_capture=true" in plan.choices[0].candidate.config        # shown, not hidden
    assert plan.regions[0].extra == {"energy_j": 0.4}
    again = json.loads(json.dumps(plan.to_json()))
    assert again == newer
    assert Plan.from_json(again).to_json() == again


def test_candidate_from_json_keeps_unknown_fields_and_a_known_one_is_unchanged():
    doc = {**Candidate("x", "ort").to_json(), "graph_capture": True, "ep_options": {"a": 1}}
    cand = Candidate.from_json(doc)
    assert cand.unknown == ["ep_options", "graph_capture"] and cand.to_json() == doc
    assert cand != Candidate("x", "ort")           # not silently the configuration without the knob
    plain = Candidate("x", "aoti", freezing=True)
    assert Candidate.from_json(plain.to_json()) == plain and plain.to_json().keys() == doc.keys() - {
        "graph_capture", "ep_options"}


def test_another_format_or_a_malformed_choice_is_refused():
    newest = max(READ_FORMATS)
    with pytest.raises(PlanFormatError, match=f"format {newest + 1}"):
        Plan.from_json({**FORMAT_1, "format": newest + 1})
    with pytest.raises(PlanFormatError, match="no candidate"):
        Plan.from_json({**FORMAT_1, "choices": [{"scope": "x"}]})
    with pytest.raises(PlanFormatError, match="not an object"):
        Plan.from_json([])
    with pytest.raises(PlanFormatError, match="malformed candidate"):
        Plan.from_json({**FORMAT_1, "choices": [{"scope": "x", "candidate": {"scope": "x", "knobs": 3}}]})


def test_mistyped_display_fields_take_their_defaults():
    plan = Plan.from_json({"format": 1, "choices": [], "measured_candidates": "7", "plan_ms": float("nan"),
                           "regions": [{"path": 3, "predicted_ms": "fast", "alternatives": ["aoti"]}, "junk"]})
    assert plan.measured_candidates == 0 and plan.plan_ms is None
    assert plan.regions[0].path == "3" and plan.regions[0].predicted_ms is None
    assert plan.regions[0].alternatives == [{"config": "aoti"}] and len(plan.regions) == 1


def test_a_pinned_plan_with_a_newer_knob_is_refused():
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.build import _pinned

    newer = json.loads(json.dumps(FORMAT_1))
    assert _pinned(newer) == Plan.from_json(newer).candidates()
    newer["choices"][0]["candidate"]["graph_capture"] = True
    with pytest.raises(RecompileError, match=r"fields this cuvil-pgc does not know \(graph_capture\)"):
        _pinned(newer)


def test_a_backend_or_precision_this_version_does_not_know_is_refused_not_built_as_torch_compile():
    # apply realizes any backend it does not name as torch.compile: a pinned Candidate("", "onnxruntime")
    # (ONNX Runtime is "ort") built and shipped torch.compile under the name onnxruntime
    from cuvil_pgc.errors import ConfigError, RecompileError
    from cuvil_pgc.recompile.build import _pinned
    from cuvil_pgc.recompile.records import Record
    from cuvil_pgc.recompile.search_records import refit_sample

    with pytest.raises(ConfigError, match=r"unknown backend 'onnxruntime' for <model>.*ONNX Runtime is 'ort'"):
        Candidate("", "onnxruntime")
    with pytest.raises(ConfigError, match=r"unknown precision 'int8' for enc.*fp32, bf16, fp16"):
        Candidate("enc", "ort", precision="int8")
    newer = json.loads(json.dumps(FORMAT_1))
    newer["choices"][0]["candidate"]["backend"] = "tvm"         # a newer cuvil-pgc's backend
    with pytest.raises(PlanFormatError, match=r"the choice for 'enc' has a malformed candidate \(unknown backend 'tvm'"):
        Plan.from_json(newer)
    with pytest.raises(RecompileError, match="the pinned plan is not usable.*unknown backend 'tvm'"):
        _pinned(newer)
    with pytest.raises(ConfigError, match="unknown backend 'onnxruntime'"):
        _pinned({"": {"scope": "", "backend": "onnxruntime"}})
    scope = {"scope": "", "path": "", "bottleneck": "compute", "eager_us": 2.0}
    record = Record("s", "<model>::tvm", "m", "i", "ok", median_us=1.0, eager_us=2.0,
                    features={"probe": True, "candidate": {"scope": "", "backend": "tvm"}, "scope": scope})
    assert refit_sample(record) is None          # an older or newer version's record is left out, not raised on
    record.features["candidate"]["backend"] = "ort"
    assert refit_sample(record) is not None


def test_the_report_and_the_cli_show_the_runtime_baselines():
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view

    plan = Plan.from_json({**FORMAT_1, "format": 2, "runtime_defaults": [
        {"config": "ort", "status": "ok", "measured_ms": 0.25},
        {"config": "openvino", "status": "compile_error", "reason": "ExportError: <b>boom</b>"}]})
    html = plan_section(plan, None, False)
    assert "Runtimes at their defaults" in html and "openvino: compile_error ExportError: &lt;b&gt;boom" in html
    caption = plan_view(plan).caption
    assert "runtimes at defaults: ort 0.2500 ms, openvino compile_error" in caption


def test_the_race_in_processes_round_trips_and_a_plan_without_it_reads_as_before():
    newer = json.loads(json.dumps(FORMAT_1))
    newer["format"] = 2
    plan = Plan.from_json(newer)
    assert plan.deployed_medians_ms == {} and "deployed_medians_ms" not in plan.to_json()
    newer["deployed_medians_ms"] = {"<model>::ort": 0.29, "model": 0.26}
    plan = Plan.from_json(newer)
    assert plan.deployed_medians_ms == {"model": 0.26, "<model>::ort": 0.29} and plan.extra == {}
    assert plan.to_json()["deployed_medians_ms"] == newer["deployed_medians_ms"]
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view

    # fastest first, like the final race
    assert "decided in processes of their own: model 0.2600 ms, <model>::ort 0.2900 ms" in plan_view(plan).caption
    html = plan_section(plan, None, False)
    assert "raced in processes of their own" in html and "&lt;model&gt;::ort: 290 µs" in html


def test_the_final_race_shows_in_the_report_and_the_cli_where_it_raced_more_than_the_plan():
    """A region's measured time comes from the final race and its alternatives' from the search:
    the race's other contenders are shown, so a shipped plan that looks slower than an alternative's
    search trial reads right."""
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view

    doc = {**json.loads(json.dumps(FORMAT_1)), "format": 2,
           "final_medians_ms": {"<model>::aoti": 0.18, "<model>::cudagraphs": 0.2, "eager": 0.43}}
    plan = Plan.from_json(doc)
    assert "final race: <model>::aoti 0.1800 ms, <model>::cudagraphs 0.2000 ms, eager 0.4300 ms" \
        in plan_view(plan).caption
    plan = Plan.from_json({**doc, "final_medians_ms": {"eager": 0.43, "<model>::cudagraphs": 0.2,
                                                       "<model>::aoti": 0.18}})
    assert "final race: <model>::aoti 0.1800 ms, <model>::cudagraphs 0.2000 ms, eager 0.4300 ms" \
        in plan_view(plan).caption                                       # fastest first
    html = plan_section(plan, None, False)
    assert "The final race" in html and html.index("::aoti: 180 µs") < html.index("::cudagraphs: 200 µs") \
        < html.index("eager: 430 µs")
    plan = Plan.from_json({**doc, "final_medians_ms": {"eager": 0.43, "<model>::aoti": 0.18}})
    assert "final race" not in plan_view(plan).caption and "The final race" not in plan_section(plan, None, False)


def test_plans_that_did_not_ship_round_trip_and_show_in_the_report_and_the_cli():
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view

    doc = {**json.loads(json.dumps(FORMAT_1)), "format": 2,
           "unloadable": {"<model>::aoti+freezing": "<model>: a process of its own that loaded it crashed (SIGSEGV)"}}
    plan = Plan.from_json(doc)
    assert plan.unloadable == doc["unloadable"] and plan.to_json()["unloadable"] == doc["unloadable"]
    html = plan_section(plan, None, False)
    assert "did not ship" in html and "&lt;model&gt;::aoti+freezing: &lt;model&gt;: a process of its own" in html
    assert "not shipped, a fresh process could not load them: <model>::aoti+freezing" in plan_view(plan).caption
    assert "did not ship" not in plan_section(Plan.from_json(FORMAT_1), None, False)


def test_a_choices_program_for_other_sizes_round_trips_and_a_malformed_one_is_dropped():
    doc = json.loads(json.dumps(FORMAT_1))
    record = {"artifact": "ort/0-shapes.onnx", "inputs": [["int64", [None, None]]]}
    doc["choices"][0]["other_shapes"] = record
    doc["choices"][1]["other_shapes"] = "not a record"
    plan = Plan.from_json(doc)
    assert plan.choices[0].other_shapes == record and plan.choices[1].other_shapes is None
    assert plan.to_json()["choices"][0]["other_shapes"] == record
    assert "other_shapes" not in Plan.from_json(json.loads(json.dumps(FORMAT_1))).to_json()["choices"][0]
    assert plan.to_json()["format"] == 2


def test_a_program_for_other_sizes_that_checks_indices_makes_the_plan_format_4():
    """An older cuvil-pgc, which reads up to format 3, would run it without checking an edge
    list against the call's nodes: it refuses the plan instead."""
    doc = json.loads(json.dumps(FORMAT_1))
    doc["choices"][0]["other_shapes"] = {"artifact": "ort/0-shapes.onnx", "inputs": [["int64", ["s0"]]],
                                         "ranges": {"s0": [1, 64]}, "index_bounds": {"0": ["s0"]}}
    written = Plan.from_json(doc).to_json()
    assert written["format"] == 4 and Plan.from_json(written).choices[0].other_shapes["index_bounds"] == {"0": ["s0"]}


@pytest.mark.parametrize("where", ["runtime", "other_shapes"])
def test_a_runtime_program_that_checks_its_computed_indices_makes_the_plan_format_5(where):
    """An older cuvil-pgc, which reads up to format 4, would hand the program's count of indices
    out of range back as one more element of a tuple the region returns: it refuses the plan."""
    doc = json.loads(json.dumps(FORMAT_1))
    choice = doc["choices"][0]
    if where == "runtime":
        choice["runtime"] = {"name": "ort", "version": "1", "outputs": None, "index_checks": "in-program"}
    else:
        choice["other_shapes"] = {"artifact": "ort/0-shapes.onnx", "inputs": [["int64", ["s0"]]],
                                  "ranges": {"s0": [1, 64]}, "index_checks": "in-program"}
    written = Plan.from_json(doc).to_json()
    assert written["format"] == 5
    assert getattr(Plan.from_json(written).choices[0], where)["index_checks"] == "in-program"


def test_a_search_stopped_by_its_time_budget_says_so_in_the_plan_the_report_and_the_cli():
    from cuvil_pgc.viewer._run_sections import plan_section
    from cuvil_pgc.viewer.console_recompile import plan_view

    why = "the search's time budget (5 min) is spent after 16 measurement(s)"
    plan = Plan.from_json({**json.loads(json.dumps(FORMAT_1)), "format": 2, "stopped": why})
    assert plan.stopped == why and plan.to_json()["stopped"] == why
    assert f"measured 7 of 24 candidates, 1 from records ({why})" in " ".join(plan_view(plan).caption.split())
    assert f"stopped: {why}" in plan_section(plan, None, False).replace("&#x27;", "'")
    unstopped = Plan.from_json(FORMAT_1)
    assert unstopped.stopped == "" and "stopped" not in unstopped.to_json()      # absent when it did not stop
    assert "stopped" not in plan_section(unstopped, None, False)


def test_the_cli_says_why_a_region_kept_eager():
    """One failure per exporter, as the candidate that ran it recorded it (its siblings' "not built:
    ... showed that" are left out), long ones cut; a region whose plan compiled says nothing."""
    from cuvil_pgc.viewer.console_recompile import FAILURE_CHARS, plan_view

    doc = json.loads(json.dumps(FORMAT_1))
    doc["regions"][0]["alternatives"] = [
        {"config": "eager", "status": "ok"},
        {"config": "aoti", "status": "compile_error", "reason": "ExportError: torch.export failed (packed): boom"},
        {"config": "aoti+freezing", "status": "compile_error", "reason": "not built: aoti showed that boom"},
        {"config": "ort", "status": "compile_error",
         "reason": "ExportError: torch.onnx.export failed (packed): " + "x" * 500},
        {"config": "openvino", "status": "compile_error", "reason": "not built: ort showed that ..."},
        {"config": "compile", "status": "accuracy_error", "reason": "outputs differ"}]
    caption = plan_view(Plan.from_json(doc)).caption
    kept = caption.split("; kept eager: ", 1)[1]
    # the cause both exporters name is told once
    assert kept.startswith("model (torch.export failed (packed): boom; torch.onnx.export failed (as above): xxx")
    assert "not built" not in kept and "outputs differ" not in kept
    assert len(kept) < 2 * FAILURE_CHARS + 20 and kept.endswith("...)")
    # submodules that failed as the model did are named with it, the reasons told once
    doc["regions"] += [{**doc["regions"][0], "path": f"model/model.{name}", "scope": name} for name in ("0", "2")]
    doc["regions"][2]["alternatives"] = doc["regions"][2]["alternatives"][:2]
    kept = plan_view(Plan.from_json(doc)).caption.split("; kept eager: ", 1)[1]
    assert kept.startswith("model, model.0 (torch.export failed (packed): boom; torch.onnx.export failed")
    assert kept.count("torch.onnx.export failed") == 1 and kept.endswith("), model.2 (torch.export failed (packed): boom)")
    doc["regions"] = doc["regions"][:1]
    doc["regions"][0]["chosen"] = "aoti"
    assert "kept eager" not in plan_view(Plan.from_json(doc)).caption


def test_the_report_shows_an_alternative_s_reason_past_the_cause_cuvil_pgc_names():
    """An export failure leads with the cause cuvil-pgc names (a quantized module's note is about 230
    characters): cut at 200, the report showed the note alone, not the exporter's message after it."""
    from cuvil_pgc.viewer._run_sections import REASON_CHARS, plan_section

    doc = json.loads(json.dumps(FORMAT_1))
    reason = "ExportError: torch.export failed (" + "n" * 240 + "): AttributeError: packed params"
    doc["regions"][0]["alternatives"] = [{"config": "aoti", "status": "compile_error", "reason": reason}]
    assert len(reason) < REASON_CHARS
    assert "AttributeError: packed params" in plan_section(Plan.from_json(doc), None, False)
