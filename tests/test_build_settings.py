"""A build holds the settings it was made with, not only the weights: attribute values such as a
temperature, ``need_weights`` or an ``eps`` are baked into an exported program. A model that
differs only there must not get the build's artifacts (it used to return the other model's
numbers), nor its cached exports or search records."""

from __future__ import annotations

import tempfile

import pytest
import torch
from torch import nn

from cuvil_pgc._structure import changed_settings, settings_by_name, settings_digest, structural_hash
from cuvil_pgc.recompile import load_build, recompile, runtimes
from cuvil_pgc.recompile.apply import ScopeInputs, measurement_key, realize
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.records import Record, RecordDB
from cuvil_pgc.recompile.search_records import SearchRecords

pytestmark = pytest.mark.usefixtures("build_env")
needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="onnxruntime not installed")


class Scorer(nn.Module):
    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.temperature = temperature
        self.fc1, self.fc2 = nn.Linear(16, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (self.fc2(torch.relu(self.fc1(x))) / self.temperature).softmax(-1)


def scorer(temperature: float) -> Scorer:
    torch.manual_seed(0)
    return Scorer(temperature).eval()


def test_the_settings_digest_tells_attribute_values_apart_and_ignores_private_state():
    assert settings_digest(scorer(1.0)) == settings_digest(scorer(1.0))
    assert settings_digest(scorer(1.0)) != settings_digest(scorer(0.1))
    assert structural_hash(scorer(1.0)) == structural_hash(scorer(0.1))       # what the structure cannot see
    assert settings_digest(nn.LayerNorm(8)) != settings_digest(nn.LayerNorm(8, eps=1e-3))
    assert settings_digest(nn.Conv2d(3, 3, 3)) != settings_digest(nn.Conv2d(3, 3, 3, stride=2))
    model = scorer(1.0)
    before = settings_digest(model)
    model._calls, model.training = 3, True                                     # private state, the mode
    assert settings_digest(model) == before


class BiasCache(nn.Module):
    """As timm's LeViT attention: the forward keeps a tensor computed from the weights in a dict,
    per device, which a fresh model (and ``eval()``) leaves empty."""

    def __init__(self, scale: float = 1.0) -> None:
        super().__init__()
        self.scale, self.bias_cache = scale, {}
        self.biases, self.fc = nn.Parameter(torch.randn(4)), nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if str(x.device) not in self.bias_cache:
            self.bias_cache[str(x.device)] = self.biases * 2
        return self.fc(x) * self.scale + self.bias_cache[str(x.device)]


def test_tensors_a_forward_keeps_in_a_dict_are_no_settings():
    torch.manual_seed(0)
    model, x = BiasCache().eval(), torch.randn(2, 4)
    fresh = settings_digest(model)
    model(x)
    assert model.bias_cache and settings_digest(model) == fresh
    assert settings_digest(BiasCache(scale=2.0)) != fresh         # the module's other settings still count
    mixed = BiasCache()
    mixed.bias_cache = {"cpu": torch.ones(2), "mode": "fast"}
    assert settings_digest(mixed) != fresh                         # a plain value in the dict is a setting


def test_a_hugging_face_model_loaded_from_another_directory_keeps_its_settings():
    transformers = pytest.importorskip("transformers")
    config = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                     intermediate_size=32, vocab_size=50)
    torch.manual_seed(0)
    model = transformers.BertModel(config).eval()
    digests = []
    for _ in range(2):
        with tempfile.TemporaryDirectory() as where:
            model.save_pretrained(where)
            digests.append(settings_digest(transformers.AutoModel.from_pretrained(where).eval()))
    assert digests[0] == digests[1]
    other = transformers.BertModel(transformers.BertConfig(**{**config.to_dict(), "layer_norm_eps": 1e-5}))
    assert settings_digest(other.eval()) != digests[0]
    # named: the config's field, and the LayerNorms' own eps the config set
    assert changed_settings(settings_by_name(model.eval()), settings_by_name(other.eval())) == [
        "config.layer_norm_eps", "eps"]


@needs_ort
def test_a_runtime_export_is_not_reused_for_a_module_with_other_settings():
    """The artifact cache was keyed by structure and weights: the second model got the first one's
    ONNX file, with its temperature baked in."""
    x = torch.randn(3, 16)
    for temperature in (1.0, 0.1):
        model = scorer(temperature)
        region = realize(model, Candidate("", "ort"), ScopeInputs((x,)), machine="t").module
        with torch.no_grad():
            torch.testing.assert_close(region(x), model(x), rtol=1e-4, atol=1e-5)


@needs_ort
def test_a_build_is_not_applied_to_a_model_with_other_settings(tmp_path, monkeypatch):
    x = torch.randn(3, 16)
    build = recompile(scorer(1.0), (x,), plan={"": Candidate("", "ort")}, rounds=3, records=False,
                      deployed_race=False)
    path = build.save(tmp_path / "s.cuvilpkg")
    monkeypatch.setenv("CUVIL_ALLOW_UNSIGNED", "1")
    assert load_build(path, scorer(1.0)).cuvil_load_report.runtime_regions == 1
    sharper = scorer(0.1)
    with pytest.warns(RuntimeWarning, match=r"settings changed since the build \(temperature\)"):
        loaded = load_build(path, sharper)
    assert loaded.cuvil_load_report.runtime_regions == 0 and loaded.cuvil_load_report.applied == []
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), sharper(x))


def test_search_records_of_other_settings_are_not_reused(tmp_path):
    db = RecordDB(tmp_path / "rec")
    cand = Candidate("", "aoti")
    inputs = {"": ScopeInputs((torch.randn(3, 16),))}
    mine = SearchRecords(db, "m", {"": "s"}, {"": "settings-a"}, {"": "w"}, inputs)
    db.add(Record(structure=mine._structure(""), candidate=measurement_key(cand), machine="m",
                  inputs=inputs[""].signature, status="ok", median_us=10.0))
    assert mine.reusable(cand) is not None
    assert SearchRecords(db, "m", {"": "s"}, {"": "settings-b"}, {"": "w"}, inputs).reusable(cand) is None


class KeepsItsLength(nn.Module):
    """Keeps the call's length on itself, as Funnel's attention structure keeps ``seq_len``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 16)
        self.seq_len = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seq_len = x.shape[1]
        return self.fc(x)[:, : self.seq_len] * 2


class Funnelish(nn.Module):
    def __init__(self, temperature: float = 1.0) -> None:
        super().__init__()
        self.structure, self.head = KeepsItsLength(), nn.Linear(16, 3)
        self.temperature = temperature

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.structure(x)) / self.temperature


def test_what_a_forward_writes_is_recorded_whatever_its_value():
    from cuvil_pgc._structure import recorded_writes, written_under

    model, x = Funnelish(), torch.randn(2, 5, 16)
    model(x)
    with recorded_writes(model) as written:
        model(x)                                    # the same length again: the same value, still a write
    assert written == {"structure.seq_len"}
    assert written_under(written, "structure") == ["seq_len"] and written_under(written, "head") == []
    assert settings_digest(Funnelish(), written) == settings_digest(model, written) != settings_digest(model)


@needs_ort
def test_a_build_applies_to_a_fresh_model_whose_forward_keeps_scratch_values(tmp_path):
    """A Funnel's build, loaded in a service onto the model it had just made, ran it eagerly:
    "settings changed since the build", because the digest at build time held the length its
    attention structure kept from the search's calls. A real setting still refuses the build."""
    torch.manual_seed(0)
    model, x = Funnelish().eval(), torch.randn(2, 5, 16)
    build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False, rounds=3)
    assert build.plan.choices[0].settings_skip == ["structure.seq_len"]
    path = build.save(tmp_path / "f.cuvilpkg")

    def fresh(temperature: float = 1.0) -> Funnelish:
        torch.manual_seed(0)
        return Funnelish(temperature).eval()

    fast = load_build(path, fresh(), allow_unsigned=True)
    assert fast.cuvil_load_report.applied == ["<model>: ort"], fast.cuvil_load_report.skipped
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)
    assert fast.fallback_calls == 0
    hotter = load_build(path, fresh(0.5), allow_unsigned=True)
    assert hotter.cuvil_load_report.applied == [] and "settings changed" in hotter.cuvil_load_report.skipped[0]
