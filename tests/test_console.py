"""Console rendering helpers."""

from __future__ import annotations

from cuvil_pgc.trace.schema import display_path


def test_console_paths_drop_ancestors_the_name_repeats():
    assert display_path("model/model.layer1/model.layer1.0/model.layer1.0.conv1") == "model.layer1.0.conv1"
    assert display_path("serve/model/model.fc") == "serve/model.fc"
    assert display_path("serve/decode/attention") == "serve/decode/attention"
