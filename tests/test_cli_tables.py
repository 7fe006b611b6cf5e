"""Tables that fit at 80 columns without cutting identifiers; --json, --csv and --wide."""

from __future__ import annotations

import csv
import io
import json
from types import SimpleNamespace

import pytest
from rich.console import Console
from typer.testing import CliRunner

from cuvil_pgc.cli import app
from cuvil_pgc.recompile.plan_doc import Plan
from cuvil_pgc.viewer.tables import Column, TableView, fitted_columns, fmt_speedup, print_view

DEEP = ["model", "model.blocks", "model.blocks.0", "model.blocks.0.attention_projection"]


@pytest.fixture(scope="module")
def deep_trace(tmp_path_factory):
    from cuvil_pgc import ProfileRegion, profile

    path = str(tmp_path_factory.mktemp("tables") / "deep.trace.json")
    with profile(path, ops=False, gpu="off", sample_hz=0):
        for _ in range(5):
            regions = [ProfileRegion(name) for name in DEEP]
            for r in regions:
                r.start()
            sum(range(20000))
            for r in reversed(regions):
                r.end()
    return path


def _lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip()]


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args), env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    return result


def test_analyze_fits_80_columns_and_prints_region_names_whole(deep_trace):
    out = _invoke("analyze", deep_trace).stdout
    assert max(len(line) for line in _lines(out)) <= 80
    assert "model.blocks.0.attention_projection" in out
    assert "model/model.blocks" not in out          # the repeated prefixes are gone
    assert "…" not in out


def test_wide_keeps_every_column(deep_trace):
    narrow = _invoke("analyze", deep_trace).stdout
    wide = _invoke("analyze", "--wide", deep_trace).stdout
    assert "p99" in wide and "evidence" in wide
    narrow_header = next(line for line in _lines(narrow) if "region" in line and "total" in line)
    assert "p99" not in narrow_header
    # the dropped columns are named once, with the way to see them (evidence is printed below instead)
    flat = " ".join(narrow.split())
    assert flat.count("hidden:") == 1 and "p99" in flat.split("hidden:")[1] and "(--wide shows them)" in flat
    assert "evidence (--wide" not in flat and "hidden:" not in wide
    assert "model.blocks.0.attention_projection" in wide     # names whole, not squeezed into 80 columns
    assert "…" not in wide
    header = next(line for line in _lines(wide) if "p99" in line)
    assert len(header) > 80


def test_wide_ops_prints_operator_names_whole(tmp_path):
    import torch

    from cuvil_pgc import profile

    path = str(tmp_path / "ops.trace.json")
    with profile(path, ops=True, gpu="off", sample_hz=0):
        torch.nn.functional.layer_norm(torch.randn(4, 16), (16,))
    wide = _invoke("ops", "--wide", path).stdout
    assert "aten::layer_norm" in wide and "…" not in wide


def test_summary_has_json_and_csv(deep_trace):
    doc = json.loads(_invoke("summary", "--json", deep_trace).stdout)
    paths = [r["path"] for r in doc["rows"]]
    assert "/".join(DEEP) in paths and doc["events"] > 0
    rows = list(csv.DictReader(io.StringIO(_invoke("summary", "--csv", deep_trace).stdout)))
    assert {r["path"] for r in rows} == set(paths)
    assert float(rows[0]["total_us"]) > 0


def test_summary_json_of_a_trace_without_regions_has_the_top_operators(tmp_path, deep_trace):
    import torch

    from cuvil_pgc import profile

    path = str(tmp_path / "noregions.trace.json")
    with profile(path, ops=True, gpu="off", sample_hz=0):
        torch.nn.functional.layer_norm(torch.randn(4, 16), (16,))
    doc = json.loads(_invoke("summary", "--json", "--top", "50", path).stdout)
    names = [op["name"] for op in doc["operators"]]
    assert "aten::layer_norm" in names                # every op of the run (which ranks first is timing)
    assert doc["operators"][0]["calls"] >= 1 and "self_cpu_us" in doc["operators"][0]
    assert len(json.loads(_invoke("summary", "--json", "--top", "2", path).stdout)["operators"]) == 2
    assert "operators" not in json.loads(_invoke("summary", "--json", deep_trace).stdout)   # regions: as before


def test_analyze_csv_carries_full_paths(deep_trace):
    rows = list(csv.DictReader(io.StringIO(_invoke("analyze", "--csv", deep_trace).stdout)))
    assert "/".join(DEEP) in {r["path"] for r in rows}


def test_columns_are_dropped_by_rank_identifiers_never():
    view = TableView("t", [Column("id", "identifier", identifier=True), Column("a", "aaaa", drop=2),
                           Column("b", "bbbb", drop=1), Column("c", "cccc")],
                     [{"id": "x" * 40, "a": "1" * 10, "b": "2" * 10, "c": "3"}])
    assert [c.key for c in fitted_columns(view, 80)] == ["id", "a", "b", "c"]
    assert [c.key for c in fitted_columns(view, 64)] == ["id", "b", "c"]
    assert [c.key for c in fitted_columns(view, 50)] == ["id", "c"]
    assert [c.key for c in fitted_columns(view, 50, wide=True)] == ["id", "a", "b", "c"]


def test_square_brackets_in_a_table_are_text_not_markup():
    """An exporter's reason quoting the user's code (`torch.cat([a, b], -1)`) lost the brackets'
    contents: rich read them as markup."""
    view = TableView("plan → out[1].cuvilpkg", [Column("id", "identifier", identifier=True)],
                     [{"id": "layers[0]"}], caption="kept eager: model (the code at m.py:13 (`torch.cat([a, b], -1)`))")
    out = io.StringIO()
    print_view(view, Console(file=out, width=120, color_system=None))
    text = "".join(out.getvalue().split())        # the caption wraps at the table's width
    assert "torch.cat([a,b],-1)" in text and "layers[0]" in text and "out[1].cuvilpkg" in text, text


def _plan(path: str) -> Plan:
    alternatives = [{"status": "ok"}, {"status": "rejected"}, {"status": "not_measured"}]
    region = {"path": path, "bottleneck": "launch_overhead", "chosen": "compile:max-autotune-no-cudagraphs",
              "baseline_ms": 1.23456, "predicted_ms": 0.61, "measured_ms": 0.5, "alternatives": alternatives}
    return Plan.from_json({"regions": [region], "stale": [], "baseline_ms": 2.0, "plan_ms": 1.0,
                           "speedup_vs_eager": 2.0000001, "measured_candidates": 2, "space_size": 10,
                           "reused_records": 0})


def test_plan_table_fits_80_columns_with_whole_names():
    from cuvil_pgc.viewer.console_recompile import plan_view

    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_view(plan_view(_plan("/".join(DEEP)), "build.cuvilpkg"), console)
    out = console.file.getvalue()
    assert max(len(line) for line in _lines(out)) <= 80
    assert "model.blocks.0.attention_projection" in out and "compile:max-autotune-no-cudagraphs" in out
    assert "…" not in out and "2.00x" in out and "2.0000001" not in out


def test_builds_list_shows_dates_and_sizes_whole_at_80():
    from cuvil_pgc.viewer.console_builds import entries_view

    entry = SimpleNamespace(name="sentiment_classifier", version=12, pointers=["current", "stable"],
                            created="2026-12-01T21:10:31+00:00", pushed_at="2026-12-01T21:11:00+00:00",
                            pushed_by="someone", signed=True, key_id="0123456789abcdef", size=123_456_789)
    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_view(entries_view([entry]), console)
    out = console.file.getvalue()
    assert max(len(line) for line in _lines(out)) <= 80
    assert "2026-12-01 21:10" in out and "123.5 MB" in out and "sentiment_classifier" in out
    assert "…" not in out


def test_speedups_have_one_precision():
    assert fmt_speedup(1.0) == "1.00x" and fmt_speedup(3.23456) == "3.23x" and fmt_speedup(None) == "-"


def _merged_plan() -> Plan:
    model = _plan("<model>")
    model.regions[0].chosen = "compile:max-autotune-no-cudagraphs+freezing"
    for i in range(2):
        region = _plan(f"model/model.encoder_blocks/model.encoder_blocks.{i}").regions[0]
        region.chosen = "merged into <model>: compile:max-autotune-no-cudagraphs+freezing"
        model.regions.append(region)
    return model


def test_plan_table_at_80_keeps_the_chosen_config_indented_and_more_columns():
    from cuvil_pgc.viewer.console_recompile import plan_view

    console = Console(width=80, file=io.StringIO(), color_system=None)
    print_view(plan_view(_merged_plan(), "out/model.cuvilpkg"), console)
    out = console.file.getvalue()
    lines = _lines(out)
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if "region" in line)
    assert "pred." in header and "speedup" in header       # the predicted speedup fits beside the measured one
    # the whole model's row names the config; merged regions say so without repeating it
    assert any(line.startswith("   compile:max-autotune-no-cudagraphs+freezing ") for line in lines)
    merged = [line for line in lines if "merged into <model>" in line]
    assert len(merged) == 2 and all(line.startswith("   merged into <model>") for line in merged)
    assert not any(line.startswith(" compile:") for line in lines)      # nothing wraps back to the margin
    flat = " ".join(out.split())
    assert flat.count("hidden:") == 1 and "(--wide shows them)" in flat


def test_plan_json_and_csv_keep_the_whole_chosen_value():
    from cuvil_pgc.viewer.console_recompile import plan_view
    from cuvil_pgc.viewer.tables import view_json

    rows = view_json(plan_view(_merged_plan()))["rows"]
    assert rows[1]["chosen"] == "merged into <model>: compile:max-autotune-no-cudagraphs+freezing"


def test_recompile_notes_wrap_at_words_within_80_columns(tmp_path, monkeypatch):
    import cuvil_pgc.recompile.build as build_mod
    from cuvil_pgc.recompile.trust import UNSIGNED_NOTE

    monkeypatch.delenv("CUVIL_SIGNING_KEY", raising=False)
    monkeypatch.setattr(build_mod, "recompile", lambda net, inputs, traces, **kw: SimpleNamespace(
        plan=_plan("model"), save=lambda *a, **k: None))
    trace = tmp_path / "t.trace.json"
    trace.write_text("{}")
    result = CliRunner().invoke(app, ["recompile", str(trace), "--model", "cuvil_pgc.zoo:mlp", "--threads", "2",
                                      "-o", str(tmp_path / "m.cuvilpkg")], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    for stream in (result.stdout, result.stderr):
        assert max(len(line) for line in stream.splitlines()) <= 80, stream
    assert "measured at 2 torch thread(s)" in result.stdout
    # wrapped between words: joining the lines with spaces gives the sentences back
    assert "(--threads N: the deployment's)" in " ".join(result.stdout.split())
    assert f"note: {UNSIGNED_NOTE}" in " ".join(result.stderr.split())
