"""A model whose forward draws random numbers between the modules that compute (a VAE sampling its
latent between encoder and decoder, a TTS model's noise) is not refused: the modules that draw stay
eager, drawing from torch's generators as they do, and the ones that draw none get programs. The
search starts each of its calls from the same generator state, so that eager's draws repeat and
the accuracy guard compares calls that drew alike; it leaves the user's generator as it found it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from cuvil_pgc.errors import RecompileError
from cuvil_pgc.recompile import recompile, runtimes
from cuvil_pgc.recompile.candidates import Candidate
from cuvil_pgc.recompile.random_draws import drawing_modules
from cuvil_pgc.recompile.stateless import check_stateless, holding
from tests._profiled import record_trace
from tests._service import run_service

needs_ort = pytest.mark.skipif(not runtimes.check("ort").ok, reason="needs onnxruntime")


class VAE(nn.Module):
    """Samples its latent in its own forward, between encoder and decoder."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16))
        self.dec = nn.Sequential(nn.Linear(8, 64), nn.ReLU(), nn.Linear(64, 32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = self.enc(x).chunk(2, -1)
        z = mu + torch.randn_like(mu) * torch.exp(0.5 * logvar)
        return self.dec(z), mu


class Sampler(nn.Module):
    def forward(self, mu: torch.Tensor) -> torch.Tensor:
        return mu + 0.5 * torch.rand_like(mu)


class WithSampler(nn.Module):
    """Draws in a submodule of its own, called between two that compute."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(16, 16)
        self.sampler = Sampler()
        self.tail = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.tail(self.sampler(self.head(x)))


class OwnGenerator(nn.Module):
    """Draws from a generator it holds, which holding torch's default ones does not repeat."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 4)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x + torch.randn(x.shape, generator=self.gen))


def vae() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    return VAE().eval(), (torch.randn(4, 32),)


def test_the_modules_that_draw_are_the_drawing_one_and_its_callers():
    model, inputs = vae()
    assert drawing_modules(model, lambda: model(*inputs)) == {""}
    torch.manual_seed(0)
    model = WithSampler().eval()
    assert drawing_modules(model, lambda: model(torch.randn(2, 16))) == {"", "sampler"}
    assert drawing_modules(model.head, lambda: model.head(torch.randn(2, 16))) == frozenset()


def test_a_forward_drawing_between_its_submodules_is_held_and_the_generator_left_as_it_was(caplog):
    model, inputs = vae()
    with caplog.at_level("WARNING", logger="cuvil_pgc.recompile"):
        held = check_stateless(model, inputs)
    assert held is not None and held.modules == {""} and held.generators is not None
    assert "draws random numbers: it stays eager" in caplog.text
    state = torch.get_rng_state()
    with torch.no_grad(), holding(model, held):
        first, second = model(*inputs), model(*inputs)
    assert torch.equal(first[0], second[0])
    assert torch.equal(torch.get_rng_state(), state)
    assert not torch.equal(model(*inputs)[0], model(*inputs)[0])       # the user's model draws as before


def test_a_model_drawing_from_a_generator_it_holds_is_still_refused():
    torch.manual_seed(0)
    with pytest.raises(RecompileError, match="draws random numbers"):
        check_stateless(OwnGenerator().eval(), (torch.randn(2, 16),))


@needs_ort
@pytest.mark.usefixtures("build_env")
def test_the_search_builds_the_submodules_and_not_the_module_that_draws(tmp_path):
    torch.manual_seed(0)
    model, inputs = WithSampler().eval(), (torch.randn(8, 16),)
    trace = record_trace(model, inputs, tmp_path / "sampler.trace.json")
    build = recompile(model, inputs, trace, records=False, backends=("ort",), rounds=3, deployed_race=False,
                      exhaustive=True)
    built = {t.candidate.scope for t in build.result.trials.values() if not t.candidate.is_baseline}
    assert built and not built & {"", "sampler"}, build.result.trials.keys()


@pytest.mark.usefixtures("build_env")
def test_a_pinned_plan_running_the_module_that_draws_is_refused():
    model, inputs = vae()
    with pytest.raises(RecompileError, match="draws random numbers"):
        recompile(model, inputs, records=False, plan={"": Candidate("", "ort")}, rounds=3)


SERVICE = """
import json, sys
import torch
from cuvil_pgc import load_build
from tests.test_random_draws import vae
eager, inputs = vae()
model, _ = vae()
built = load_build(sys.argv[1], model, pubkey=sys.argv[2])
errors, draws = [], []
with torch.no_grad():
    for seed in range(3):
        torch.manual_seed(seed)
        got = built(*inputs)
        torch.manual_seed(seed)
        want = eager(*inputs)
        errors.append(max(float((a - b).abs().max()) for a, b in zip(got, want)))
        draws.append(float(got[0].sum()))
print(json.dumps({"errors": errors, "distinct": len(set(draws)), "regions": built.cuvil_load_report.runtime_regions}))
"""


@needs_ort
@pytest.mark.usefixtures("build_env")
def test_a_loaded_build_draws_as_eager_does_around_its_programs_in_a_service(tmp_path, keys):
    """The encoder and decoder pinned on ONNX Runtime: the plan passes the guard end to end, and
    the signed build, loaded in a fresh process, returns eager's outputs for eager's seed (the
    model's forward draws the latent between the two programs) and other samples for others."""
    model, inputs = vae()
    build = recompile(model, inputs, records=False, rounds=3, deployed_race=False,
                      plan={"enc": Candidate("enc", "ort"), "dec": Candidate("dec", "ort")})
    path = build.save(tmp_path / "vae.cuvilpkg", signing_key=str(keys[0]))
    report = run_service(SERVICE, path, keys[1], cwd=tmp_path)
    assert report["regions"] == 2 and report["distinct"] == 3, report
    assert max(report["errors"]) < 1e-5, report


class Attending(nn.Module):
    """Dropout layers in eval mode and attention through scaled_dot_product_attention: operators
    tagged as drawing random numbers that draw none here."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.drop = nn.Dropout(0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape                 # (batch, heads, tokens, head size): the fused CPU kernel's
        q, k, v = self.qkv(x).view(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
        return self.drop(y.transpose(1, 2).reshape(b, t, 16))


class NoisyAttention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attending()
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.attn(x) + 0.1 * torch.randn_like(x))


def test_dropout_in_eval_mode_and_attention_without_dropout_draw_nothing():
    torch.manual_seed(0)
    model = NoisyAttention().eval()
    assert drawing_modules(model, lambda: model(torch.randn(2, 5, 16))) == {""}
    model.attn.drop.train()             # dropout on: it draws
    assert drawing_modules(model, lambda: model(torch.randn(2, 5, 16))) == {"", "attn", "attn.drop"}
