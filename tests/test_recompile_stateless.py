"""recompile refuses a model whose forward changes state that outlives the call (a buffer, an
input), names it, and leaves the user's model and inputs as they were. Before, the search's
calls advanced that state (an input doubled in place reached inf) and every candidate failed
the accuracy guard with "off by up to nan"."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from cuvil_pgc.cli import main
from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.stateless import check_stateless, holding
from tests._profiled import record_trace
from tests._service import run_service


class RunningSum(nn.Module):
    """Its weights are its own: no submodule leaves its state alone to be searched."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(8, 8))
        self.register_buffer("seen", torch.zeros(8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen.add_(x.sum(0))
        return x @ self.weight + self.seen


class StreamingNormalizer(nn.Module):
    """Keeps a running mean of its inputs and counts its calls at inference (a streaming feature
    normalizer, the counter assigned anew at each call); ``net`` leaves that state alone."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("mean", torch.zeros(16))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.count = self.count + 1
        self.mean.mul_(0.9).add_(0.1 * x.mean(0))
        return self.net(x - self.mean)


class Tracker(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("total", torch.zeros(16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch.add(self.total, x.sum(0), out=self.total)
        return x - 0.1 * self.total


class TrackedNet(nn.Module):
    """The state is a submodule's (``track``); ``head`` beside it leaves it alone."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(16, 16)
        self.track = Tracker()
        self.head = nn.Sequential(nn.Linear(16, 16), nn.Tanh())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.track(self.stem(x)))


class DoublesItsInput(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x.mul_(2)
        return self.fc(x)


class LazyCache(nn.Module):
    """Builds a table on its first call, as rotary-embedding caches do, then only reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.register_buffer("table", torch.zeros(0), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.table.numel() == 0:
            self.table = torch.arange(8.0)
        return self.fc(x) + self.table


class Reassigns(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps = self.steps + 1
        return x * self.steps


class NoisyAtInference(nn.Module):
    """Adds noise in its forward whatever the mode, as a sampled latent or noise injection does, and
    holds its weights itself: no submodule with weights draws none (tests/test_random_draws.py has
    the models that have one)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(4, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x + 0.01 * torch.randn_like(x)) @ self.weight.T


class DiffersOnlyOnItsFirstCall(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.warmed = False       # set by the first call, the same after every later one: not state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.fc(x) + (0.0 if self.warmed else 1.0)
        self.warmed = True
        return out


def running_sum():
    torch.manual_seed(0)
    return RunningSum().eval(), (torch.randn(4, 8),)


def streaming_normalizer():
    torch.manual_seed(0)
    return StreamingNormalizer().eval(), (torch.randn(8, 16),)


@pytest.mark.usefixtures("build_env")
@pytest.mark.parametrize("factory, named", [(running_sum, "buffer seen"),
                                            (lambda: (DoublesItsInput().eval(), (torch.randn(4, 8),)), "input 0")])
def test_recompile_names_the_state_and_leaves_model_and_inputs_as_they_were(factory, named):
    model, inputs = factory()
    buffers = {k: v.clone() for k, v in model.state_dict().items()}
    given = inputs[0].clone()
    with pytest.raises(RecompileError) as err:
        recompile(model, inputs, records=False, backends=("eager",))
    assert named in str(err.value) and "on every call" in str(err.value) and err.value.fix
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in buffers.items())
    assert torch.equal(inputs[0], given)


def test_a_cache_built_on_the_first_call_is_not_state():
    model = LazyCache().eval()
    check_stateless(model, (torch.randn(2, 8),))
    assert torch.equal(model.table, torch.arange(8.0))           # built once, as eager's first call does


def test_a_buffer_assigned_anew_on_every_call_is_put_back():
    model = Reassigns().eval()
    original = model.steps
    with pytest.raises(RecompileError, match="buffer steps"):
        check_stateless(model, (torch.ones(2),))
    assert model.steps is original and float(original) == 0.0 and "steps" in model.state_dict()


def test_a_nan_buffer_left_alone_is_not_a_change():
    model = RunningSum().eval()
    model.seen.fill_(float("nan"))
    model.forward = lambda x: x @ model.weight        # reads nothing, changes nothing
    check_stateless(model, (torch.randn(2, 8),))


def test_the_cli_says_it_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CUVIL_CACHE_DIR", str(tmp_path / "cache"))
    model, inputs = running_sum()
    trace = record_trace(model, inputs, tmp_path / "sum.trace.json")
    with pytest.raises(SystemExit) as done:
        main(["recompile", str(trace), "--model", f"{os.path.abspath(__file__)}:running_sum",
              "-o", str(tmp_path / "b.cuvilpkg"), "--backends", "eager"])
    err = capsys.readouterr().err
    assert done.value.code != 0 and "buffer seen" in err and "Traceback" not in err
    assert not (tmp_path / "b.cuvilpkg").exists()


needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")


@needs_ort
@pytest.mark.usefixtures("build_env")
def test_a_model_changing_its_own_buffers_stays_eager_and_its_submodules_are_searched(tmp_path, caplog):
    """A streaming normalizer is not refused: its ``net`` leaves the running mean and the call
    counter alone. The search builds candidates for ``net`` and none for the model, and leaves
    the user's buffers as they were (the counter the same tensor, though the forward assigns anew)."""
    model, inputs = streaming_normalizer()
    trace = record_trace(model, inputs, tmp_path / "norm.trace.json")
    model, inputs = streaming_normalizer()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    count = model.count
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile"):
        build = recompile(model, inputs, trace, records=False, backends=("ort",), rounds=3, deployed_race=False,
                          exhaustive=True)     # (the cost models may predict no gain for so small a net)
    assert "changes buffer mean, buffer count on every call: it stays eager" in caplog.text
    built = {t.candidate.scope for t in build.result.trials.values() if not t.candidate.is_baseline}
    assert "net" in built and "" not in built, build.result.trials.keys()
    assert all(c.is_baseline for s, c in build.result.choices.items() if s == "")
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items()) and model.count is count

    caplog.clear()
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile"):     # no profile: nothing to search, said
        bare = recompile(model, inputs, records=False, backends=("ort",), rounds=3, deployed_race=False)
    assert all(t.candidate.is_baseline for t in bare.result.trials.values())
    assert "without a profile no submodule is searched" in caplog.text


SERVICE = """
import json, sys
import torch
from cuvil_pgc import load_build
from tests.test_recompile_stateless import streaming_normalizer
eager, inputs = streaming_normalizer()
model, _ = streaming_normalizer()
built = load_build(sys.argv[1], model, pubkey=sys.argv[2])
errors = []
with torch.no_grad():
    for i in range(3):
        x = inputs[0] * (i + 1)
        errors.append(float((built(x) - eager(x)).abs().max()))
print(json.dumps({"errors": errors, "counts": [int(model.count), int(eager.count)], "regions":
                  built.cuvil_load_report.runtime_regions, "mean": float((model.mean - eager.mean).abs().max())}))
"""


@needs_ort
@pytest.mark.usefixtures("build_env")
def test_the_build_of_a_model_changing_its_buffers_updates_them_as_eager_does_in_a_service(tmp_path, keys):
    """``net`` pinned on ONNX Runtime: the plan passes the guard end to end (each of the search's
    calls computes from the user's state, which it puts back first), and the signed build, loaded
    onto a fresh model in a service, returns eager's outputs call after call, the model's forward
    updating its buffers around ``net``'s program."""
    model, inputs = streaming_normalizer()
    build = recompile(model, inputs, records=False, plan={"net": Candidate("net", "ort")}, rounds=3,
                      deployed_race=False)
    path = build.save(tmp_path / "norm.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE, path, keys[1], cwd=tmp_path)
    assert report["regions"] == 1 and report["counts"] == [3, 3], report
    assert max(report["errors"]) < 1e-5 and report["mean"] == 0.0, report


@pytest.mark.usefixtures("build_env")
def test_a_pinned_plan_running_a_module_that_changes_the_buffers_is_refused():
    model, inputs = streaming_normalizer()
    with pytest.raises(RecompileError, match="changes the model's buffers") as err:
        recompile(model, inputs, records=False, plan={"": Candidate("", "compile")}, rounds=3)
    assert "submodules whose calls leave the buffers, those numbers and torch's random generators alone" \
        in err.value.fix


def test_the_modules_whose_calls_change_a_buffer_are_kept_and_the_state_held_while_recompile_calls():
    """The state is a submodule's: it and the model are kept eager, its siblings are not; while
    held, every call starts from the state before recompile's calls, and leaving puts it back."""
    torch.manual_seed(0)
    model, x = TrackedNet().eval(), torch.randn(4, 16)
    held = check_stateless(model, (x,))
    assert held is not None and held.modules == {"", "track"}
    assert [name for name, _, _ in held.buffers] == ["track.total"] and not model.track.total.any()
    with torch.no_grad():
        with holding(model, held):
            first = model(x)
            assert not model.track.total.any()             # put back after the call too
            model.track.total.fill_(5.0)
            assert torch.equal(model(x), first)            # and before it
        assert not model.track.total.any()
        assert torch.equal(model(x), first) and not torch.equal(model(x), first)   # outside: the state is the user's


class GrowingLog(nn.Module):
    """A forward that grows its log buffer in place by a row each call."""

    def __init__(self):
        super().__init__()
        self.net = nn.Linear(8, 8)
        self.register_buffer("log", torch.zeros(1, 8))

    def forward(self, x):
        y = self.net(x)
        n = self.log.shape[0]
        self.log.resize_(n + 1, 8)[n] = y.detach().mean(0)
        return y


def test_a_buffer_resized_in_place_by_each_call_is_put_back_whole():
    """Putting the buffers back copied into the resized tensor and raised (a size mismatch, reported
    as the user's model raising): the value before the calls now takes the resized tensor's place."""
    torch.manual_seed(0)
    model, x = GrowingLog().eval(), torch.randn(4, 8)
    held = check_stateless(model, (x,))
    assert held is not None and held.modules == {""}
    assert model.log.shape == (1, 8) and not model.log.any()
    with torch.no_grad(), holding(model, held):
        model(x)
        model(x)
    assert model.log.shape == (1, 8) and not model.log.any()


def test_a_model_whose_only_weights_change_state_is_still_refused():
    model, inputs = running_sum()
    with pytest.raises(RecompileError, match="no submodule with weights leaves it alone"):
        check_stateless(model, inputs)


@pytest.mark.usefixtures("build_env")
def test_a_forward_that_draws_random_numbers_is_refused_up_front_with_the_cause():
    torch.manual_seed(0)
    model, inputs = NoisyAtInference().eval(), (torch.randn(2, 8),)
    with pytest.raises(RecompileError) as err:
        recompile(model, inputs, records=False, backends=("eager", "aoti"))
    assert "draws random numbers" in str(err.value) and "off by up to" in str(err.value)
    assert "no submodule with weights draws none" in str(err.value)
    assert "outside the model" in err.value.fix
    check_stateless(model, inputs, rtol=1.0, atol=1.0)       # noise the caller's tolerances accept


def test_outputs_that_differ_only_on_the_first_call_are_not_random():
    model = DiffersOnlyOnItsFirstCall().eval()
    assert check_stateless(model, (torch.randn(2, 8),)) is None
    assert model.warmed


class AddsToItsFeatures(nn.Module):
    """As sentence-transformers' modules do: the features dict in, the same dict out, embeddings added."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(20, 4)

    def forward(self, features: dict) -> dict:
        features["token_embeddings"] = self.emb(features["input_ids"])
        features["sentence_embedding"] = features["token_embeddings"].mean(1)
        return features


class Copying(nn.Module):
    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, features: dict) -> dict:
        return self.model(dict(features))


def test_a_forward_adding_to_its_input_dict_is_refused_with_the_wrapper_and_the_dict_put_back():
    """The search's calls grew the example dict, the build was made for a dict with the embeddings
    in it, and no call of the user's (ids and mask only) ever matched it: every one ran eagerly."""
    features = {"input_ids": torch.randint(0, 20, (2, 5)), "attention_mask": torch.ones(2, 5)}
    given = dict(features)
    with pytest.raises(RecompileError, match=r"changes the entries of the dict input\[0\] \('sentence_embedding', "
                                             r"'token_embeddings'\) on every call") as err:
        check_stateless(AddsToItsFeatures().eval(), (features,))
    assert "self.model(dict(features))" in err.value.fix
    assert features.keys() == given.keys() and all(features[k] is v for k, v in given.items())
    check_stateless(Copying(AddsToItsFeatures()).eval(), (features,))           # the fix it names passes


class KeyCache:
    """A Hugging Face cache in miniature: a plain object whose layers append their keys to it."""

    def __init__(self) -> None:
        self.keys: list[torch.Tensor] = []


class AppendingLayer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.k = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor, cache: KeyCache) -> torch.Tensor:
        cache.keys.append(self.k(x))
        keys = torch.cat(cache.keys, 0)
        return x + torch.softmax(x @ keys.T, -1) @ keys


class Decoder(nn.Module):
    """Makes the cache each call and hands it to its layers (a decoder with use_cache on)."""

    def __init__(self) -> None:
        super().__init__()
        self.first, self.second, self.head = AppendingLayer(), AppendingLayer(), nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cache = KeyCache()
        return self.head(self.second(self.first(x, cache), cache))


def test_a_submodule_that_changes_an_object_it_is_given_is_not_a_scope(caplog):
    """A decoder layer appends to the cache it is given: no program captured from one call does
    that, and replaying the captured call appended again (a Mistral's search ended in an internal
    error, its attention mask one window longer than its keys). The module that makes the object
    stays a scope; the layers are left out, with a warning naming them and the object."""
    from cuvil_pgc.recompile.apply import capture_scope_inputs

    torch.manual_seed(0)
    model, x = Decoder().eval(), torch.randn(3, 8)
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.apply"):
        scopes = capture_scope_inputs(model, (x,), ["first", "second", "head"])
    assert sorted(scopes) == ["", "head"]
    assert "first, second change an object they are given (input 1 (a KeyCache))" in caplog.text
    build = recompile(model, (x,), records=False, deployed_race=False, rounds=3, backends=("eager", "compile"))
    with torch.no_grad():
        torch.testing.assert_close(build.module(x), model(x))


class DecodingStep(nn.Module):
    """A decoding step: appends to the cache it is given, as a Hugging Face model called with one."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = AppendingLayer()

    def forward(self, x: torch.Tensor, cache: KeyCache) -> torch.Tensor:
        return self.layer(x, cache)


def test_a_call_that_adds_to_the_cache_it_is_given_is_refused_and_the_cache_put_back():
    """The cache grew on each of the check's calls, the outputs moved with it, and recompile said
    the forward "draws random numbers"; the user's cache kept the keys its calls appended."""
    torch.manual_seed(0)
    cache = KeyCache()
    cache.keys.append(torch.randn(2, 8))
    kept = cache.keys[0].clone()
    with pytest.raises(RecompileError, match=r"changes input 1 \(a KeyCache\) on every call") as info:
        recompile(DecodingStep().eval(), (torch.randn(3, 8), cache), records=False, deployed_race=False, rounds=3)
    assert "random" not in str(info.value) and "without the object" in info.value.fix
    assert len(cache.keys) == 1 and torch.equal(cache.keys[0], kept)


class RescalesOnce(nn.Module):
    """Rescales its weight in place on its first call in eval mode, as RWKV's layers do."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)
        self.rescaled = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training and not self.rescaled:
            with torch.no_grad():
                self.fc.weight.div_(2)
            self.rescaled = True
        return self.fc(x) * 2


@pytest.mark.usefixtures("build_env")
@pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")
def test_a_model_rewriting_its_weights_on_its_first_call_is_told_to_be_called_before_load_build(tmp_path, caplog):
    """An RWKV's build never applied in a service: its first call halves some weights in place, the
    build held them halved, and the service's fresh model had other weights ("weights changed since
    the build ... a checkpoint loaded after load_build"). Both places now say to call it once first."""
    from cuvil_pgc import load_build

    def fresh():
        torch.manual_seed(0)
        return RescalesOnce().eval()

    model, x = fresh(), torch.randn(3, 8)
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.stateless"):
        build = recompile(model, (x,), plan={"": Candidate("", "ort")}, records=False, deployed_race=False,
                          rounds=3)
    said, = [r.getMessage() for r in caplog.records if "first call changed its weights" in r.getMessage()]
    assert "(fc.weight)" in said and "call the model once before load_build" in said
    path = build.save(tmp_path / "r.cuvilpkg")
    cold = load_build(path, fresh(), allow_unsigned=True)
    assert cold.cuvil_load_report.applied == [] and "as RWKV's does" in cold.cuvil_load_report.skipped[0]
    warm = fresh()
    warm(x)
    fast = load_build(path, warm, allow_unsigned=True)
    assert fast.cuvil_load_report.applied == ["<model>: ort"]
    with torch.no_grad():
        torch.testing.assert_close(fast(x), model(x), rtol=1e-4, atol=1e-5)


def test_an_embedding_with_max_norm_is_told_to_renormalize_its_table_once(caplog):
    """``nn.Embedding(max_norm=...)`` renormalizes the rows each call looks up, in place: a service's
    model called with other ids never matched the build's weights, and the old advice (call the model
    once before load_build) did not help. The warning gives the fix, which keeps the outputs."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(50, 8, max_norm=1.0), nn.Flatten(), nn.Linear(40, 2)).eval()
    ids = torch.randint(0, 50, (3, 5))
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile.stateless"):
        check_stateless(model, (ids,))
    said, = [r.getMessage() for r in caplog.records]
    assert said.startswith("cuvil-pgc: 0 renormalizes the rows each call looks up in place (max_norm)"), said
    assert "call the model once" not in said
    other = torch.randint(0, 50, (3, 5))
    with torch.no_grad():
        expected = model(other)
        model[0].weight.copy_(torch.renorm(model[0].weight, 2, 0, model[0].max_norm))    # the fix it gives
        model[0].max_norm = None
        torch.testing.assert_close(model(other), expected)
    caplog.clear()
    check_stateless(model, (ids,))
    assert not caplog.records


class InPlaceStem(nn.Module):
    """A stem ending in an activation applied in place, as timm's and torchvision's nets do: the
    activation's input is the tensor the next module gets."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.act = nn.Conv2d(3, 8, 3, padding=1), nn.SiLU(inplace=True)
        self.body = nn.Sequential(nn.Conv2d(8, 8, 3, padding=1), nn.SiLU(), nn.Conv2d(8, 8, 3, padding=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(self.act(self.conv(x)))


def test_a_submodule_that_changes_its_input_in_place_is_not_a_scope_and_others_inputs_stay(caplog):
    """Replaying the stem's SiLU(inplace=True) on its captured input applied it again to the tensor
    the body captured as its input: each replay changed the body's input, and every candidate of
    timm's MobileViT stages failed the guard, "4096 of 4096 values off by up to 2.05"."""
    from cuvil_pgc.recompile.apply import capture_scope_inputs

    torch.manual_seed(0)
    model, x = InPlaceStem().eval(), torch.randn(1, 3, 16, 16)
    with caplog.at_level("INFO", logger="cuvil_pgc.recompile.apply"):
        scopes = capture_scope_inputs(model, (x,), ["conv", "act", "body"])
    assert sorted(scopes) == ["", "body", "conv"]
    assert "act changes the tensor it is given in place (input 0)" in caplog.text
    body_input = scopes["body"].args[0].clone()
    modules = dict(model.named_modules())
    with torch.no_grad():
        for scope, inputs in scopes.items():       # what the search's references and census do
            (modules[scope] if scope else model)(*inputs.args)
    assert torch.equal(scopes["body"].args[0], body_input)


@pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")
def test_the_search_checks_a_module_after_an_in_place_activation_on_the_inputs_it_got(tmp_path, monkeypatch):
    from cuvil_pgc.recompile import search as search_mod

    def with_body(root, feats, limit):       # the body is searched whatever the profile's timings say
        chosen = search_mod_choose(root, feats, limit)
        return chosen + [f for f in feats if f.scope == "body" and f not in chosen]

    search_mod_choose = search_mod.choose_scopes
    monkeypatch.setattr(search_mod, "choose_scopes", with_body)
    torch.manual_seed(0)
    model, x = InPlaceStem().eval(), torch.randn(1, 3, 32, 32)
    trace = record_trace(model, (x,), tmp_path / "stem.trace.json")
    build = recompile(model, (x,), trace, records=False, deployed_race=False, rounds=3, backends=("ort",),
                      exhaustive=True, calibrate=False)
    body = [t for t in build.result.trials.values() if t.candidate.scope == "body" and t.candidate.backend == "ort"]
    assert body and all(t.status == "ok" for t in body), [(t.candidate.key, t.status, t.reason) for t in body]


class DenseLayer(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm, self.fc = nn.BatchNorm1d(width), nn.Linear(width, 4)

    def forward(self, features: list[torch.Tensor]) -> torch.Tensor:
        return self.fc(self.norm(torch.cat(features, 1)))


class Dense(nn.Module):
    """torchvision's DenseNet block: each layer gets the list of the features so far, which the
    block then extends with the layer's own."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList(DenseLayer(4 * (i + 1)) for i in range(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = [x]
        for layer in self.layers:
            features.append(layer(features))
        return torch.cat(features, 1)


def test_a_list_its_caller_extends_after_the_call_is_captured_as_the_call_got_it():
    """DenseNet-121's recompile ended in an internal error: the first layer's captured list held
    every feature of the block by the time it was replayed ("running_mean should contain 256
    elements not 64")."""
    from cuvil_pgc.recompile.apply import capture_scope_inputs

    torch.manual_seed(0)
    model, x = Dense().eval(), torch.randn(2, 4)
    scopes = capture_scope_inputs(model, (x,), ["layers.0", "layers.1"])
    assert [len(scopes[s].args[0]) for s in ("layers.0", "layers.1")] == [1, 2]
    with torch.no_grad():
        out = model.layers[1](*scopes["layers.1"].args)
    torch.testing.assert_close(out, model.layers[1]([x, model.layers[0]([x])]))
    build = recompile(model, (x,), plan={"layers.0": Candidate("layers.0", "eager")}, records=False,
                      deployed_race=False, rounds=3, calibrate=False)
    with torch.no_grad():
        torch.testing.assert_close(build.module(x), model(x))


class CountingNormalizer(nn.Module):
    """Counts its calls in a Python attribute, as a service's metrics read it, and keeps the last
    batch size (the same each call: no state); ``net`` leaves both alone."""

    def __init__(self) -> None:
        super().__init__()
        self.calls, self.last_batch = 0, None
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        self.last_batch = x.shape[0]
        return self.net(x)


def counting_normalizer():
    torch.manual_seed(0)
    return CountingNormalizer().eval(), (torch.randn(8, 16),)


def test_a_python_counter_the_forward_advances_is_state_held_and_put_back():
    """A whole-model program held the count as a constant: the loaded build's counter stood still.
    The counter is state like a buffer: the model stays eager around ``net``, recompile's calls
    leave the count where the user's model had it."""
    model, inputs = counting_normalizer()
    model.calls = 7
    held = check_stateless(model, inputs)
    assert held is not None and held.modules == {""} and held.attributes == (("calls", 7),)
    assert model.calls == 7          # (last_batch, the same on every call, is not held)
    with torch.no_grad():
        with holding(model, held):
            model(*inputs)
            model(*inputs)
            assert model.calls == 7
        model(*inputs)
    assert model.calls == 8


@pytest.mark.usefixtures("build_env")
def test_a_pinned_whole_model_plan_of_a_counting_forward_is_refused():
    model, inputs = counting_normalizer()
    with pytest.raises(RecompileError, match="a call counter"):
        recompile(model, inputs, records=False, plan={"": Candidate("", "compile")}, rounds=3)
    assert model.calls == 0


COUNTING_SERVICE = """
import json, sys
import torch
from cuvil_pgc import load_build
from tests.test_recompile_stateless import counting_normalizer
model, inputs = counting_normalizer()
built = load_build(sys.argv[1], model, pubkey=sys.argv[2])
with torch.no_grad():
    for _ in range(3):
        built(*inputs)
print(json.dumps({"calls": built.calls, "regions": built.cuvil_load_report.runtime_regions}))
"""


@needs_ort
@pytest.mark.usefixtures("build_env")
def test_a_loaded_build_of_a_counting_model_counts_its_calls_in_a_service(tmp_path, keys):
    """The search builds ``net`` and no whole-model program, and the service's counter counts."""
    model, inputs = counting_normalizer()
    trace = record_trace(model, inputs, tmp_path / "count.trace.json")
    model, inputs = counting_normalizer()
    build = recompile(model, inputs, trace, records=False, backends=("ort",), rounds=3, deployed_race=False,
                      exhaustive=True)
    built = {t.candidate.scope for t in build.result.trials.values() if not t.candidate.is_baseline}
    assert "net" in built and "" not in built, build.result.trials.keys()
    path = build.save(tmp_path / "count.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(COUNTING_SERVICE, path, keys[1], cwd=tmp_path)
    assert report == {"calls": 3, "regions": 1}, report
