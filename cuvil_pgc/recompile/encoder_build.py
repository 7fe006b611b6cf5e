"""An encoder-decoder's encoder gets a build of its own.

``generate()`` runs an encoder-decoder's encoder (``model.get_encoder()``) once per generation, on
the source, and its decoder once per token: the decoding builds (:mod:`.decoding_forward`) serve the
decoder's calls, and a build of the encoder serves the source's. It is made from the encoder alone,
``recompile(model.get_encoder(), generate_encoder_call(model, ids))``, and loads onto the whole
model: :func:`encoder_of` finds the encoder such a build was made for, and :func:`with_encoder`
returns a copy of the model whose encoder is the loaded build, the modules on the way to it copied
so that the model itself runs as it did (BART's encoder is ``model.model.encoder``, T5's
``model.encoder``). The copy records the model it was made from (as the decoding builds' copies do),
so a build loaded onto it is checked against and built onto the model itself: an encoder's build
loaded again replaces the loaded one instead of wrapping it, and the decoding builds keep it.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from cuvil_pgc.errors import BuildError
from cuvil_pgc.recompile.apply import replace_submodule
from cuvil_pgc.recompile.decoding_forward import MODEL, own_model
from cuvil_pgc.recompile.generate_calls import encoder_module


def encoder_of(given: Any, model_class: str | None) -> nn.Module | None:
    """The encoder of ``given``'s model (:func:`~.decoding_forward.own_model`: ``given``, or the
    model a loaded build's copy was made from), an encoder-decoder, where a build recompiled from a
    ``model_class`` is that encoder's; None for any other build."""
    model = own_model(given)
    if not model_class or type(model).__qualname__ == model_class:
        return None
    encoder = encoder_module(model)
    return encoder if encoder is not None and type(encoder).__qualname__ == model_class else None


def with_encoder(given: nn.Module, loaded: nn.Module, path: str) -> nn.Module:
    """A copy of ``given`` whose encoder (the model's own, or a build of it loaded before) is
    ``loaded``; ``given`` itself, and the modules it shares with the copy, are left as they were."""
    current = given.get_encoder()
    name = next((n for n, m in given.named_modules() if m is current), "")
    if not name:
        raise BuildError(f"the {type(given).__name__}'s encoder is not one of its submodules, so its build has no "
                         "place to go", path=path, fix="load the build onto the encoder itself and use it directly")
    out = copy.copy(given)
    out._modules = dict(given._modules)
    replace_submodule(out, name, loaded)
    out.__dict__[MODEL] = own_model(given)
    return out
