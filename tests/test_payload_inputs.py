"""A region taking a request's data in Python values (texts a forward tokenizes, token ids as
lists) has no program: a program holds such values as constants and answers only the captured
request. A text classifier tokenizing its ``list[str]`` in its forward was built as one ONNX
Runtime program of the captured texts' logits, 16.55x eager by the search's figures, and ran its
original module for every text a service sent; its encoder, called with tensors, is what gets a
program."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.analyze.analysis import Analysis, RegionStats
from cuvil_pgc.recompile import runtimes
from cuvil_pgc.recompile import search as search_mod
from cuvil_pgc.recompile.call_binding import payload_input
from cuvil_pgc.recompile.trials import SearchOptions


@pytest.mark.parametrize(("args", "kwargs", "found"), [
    ((["the quick fox", "a dog"],), {}, "text ('the quick fox')"),
    (("a whole sentence",), {}, "text ('a whole sentence')"),
    ((torch.zeros(2), {"query": "x" * 40}), {}, "text ('" + "x" * 40 + "')"),
    ((b"\x89PNG",), {}, "bytes (4)"),
    (([[101, 2054, 2003] * 6, [101, 2003] * 9],), {}, "36 Python numbers in a list"),
    ((list(range(40)),), {}, "40 Python numbers in a list"),
    ((torch.zeros(2), "mean"), {"mode": "bilinear", "return_dict": True}, None),     # flags
    ((torch.zeros(2), [7, 7], (3, 3), torch.Size([2, 3])), {"scale": 0.5}, None),    # configuration
    (({"0": torch.zeros(1)}, [torch.zeros(1)], ["0", "1", "2", "pool"], [(800, 1216), (800, 1088)]), {}, None),
])
def test_a_request_s_data_in_python_values_is_told_from_flags_and_sizes(args, kwargs, found):
    assert payload_input(args, kwargs) == found


def region(path: str, mean_us: float, module: str) -> RegionStats:
    return RegionStats(path=path, calls=10, total_us=mean_us * 10, self_us=mean_us * 10, mean_us=mean_us,
                       p50_us=mean_us, p95_us=mean_us, p99_us=mean_us, share=0.5, hotness=mean_us * 10,
                       bottleneck="launch_overhead", confidence=0.9, evidence={"module": module})


class TextClassifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Embedding(64, 16), nn.Flatten(), nn.Linear(96, 4))

    def forward(self, texts):
        ids = torch.tensor([[ord(c) % 64 for c in t[:6].ljust(6)] for t in texts])
        return self.body(ids)


@pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")
def test_a_model_tokenizing_its_texts_gets_programs_for_what_it_calls_with_tensors(tmp_path, monkeypatch, caplog):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    torch.manual_seed(0)
    model = TextClassifier().eval()
    monkeypatch.setattr(search_mod, "MIN_EXPLORE", 10**6)     # no stop rule: every candidate is tried
    analysis = Analysis(regions=[region("model", 300.0, "TextClassifier"), region("model/model.body", 250.0, "Sequential")])
    options = SearchOptions(budget=40, backends=("ort",), rounds=3, deployed_race=False)
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.search"):
        result = search_mod.search(model, (["the quick brown fox", "jumps over"],), analysis, options=options,
                                   records=None, machine_key="m")
    assert "cuvil-pgc: <model> gets no program: it takes text ('the quick brown fox')" in caplog.text
    whole = [t for key, t in result.trials.items() if key.startswith("<model>::ort")]
    assert whole and all(t.status in ("runs_original", "not_measured") for t in whole), whole
    assert any("takes text ('the quick brown fox')" in (t.reason or "") for t in whole)
    body = [t for key, t in result.trials.items() if key.startswith("body::ort")]
    assert any(t.status == "ok" for t in body), result.trials


def test_a_pinned_program_of_a_region_taking_texts_is_refused(tmp_path, monkeypatch):
    from cuvil_pgc.errors import RecompileError
    from cuvil_pgc.recompile.candidates import Candidate

    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    options = SearchOptions(budget=4, backends=("ort",), rounds=3, deployed_race=False,
                            fixed={"": Candidate("", "ort")})
    with pytest.raises(RecompileError, match=r"pinned plan runs 'the whole model' on ort, but it takes text "
                                             r"\('the quick brown fox'\)") as info:
        search_mod.search(TextClassifier().eval(), (["the quick brown fox", "jumps over"],), None, options=options,
                          records=None, machine_key="m")
    assert "pin the modules it calls with tensors" in str(info.value)
