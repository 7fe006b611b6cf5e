"""One-line explanations of graph breaks, recompiles and cache misses, from torch's own records.

Pure string work, no torch import; the inputs are what torch's structured trace logs:

- FX-graph-cache key components (``fx_graph_cache_miss``/``hit`` artifacts, built by
  ``torch._inductor.codecache.FxGraphHashDetails``): lines ``"[<hash>] <name>: <value>"``, one per
  thing that goes into the key (graph code, each example input's TensorMetadata, torch version,
  every Inductor config entry, system info). Two compiles of the same frame differ in their key
  exactly where these lines differ, so the diff of two component lists *is* the explanation.
- Guard-failure reasons (``recompile_reasons`` artifact), e.g. ``"0/0: tensor 'x' size mismatch at
  index 0. expected 4, actual 6"`` (the prefix names the cache entry whose guards failed).
- ``describe_tensor`` / ``describe_source`` records: each example input's size, dtype and stride.
- Graph-break messages (``dynamo_graph_break_reason``): ``"Graph break in user code at F:L"``,
  ``"Graph Break Reason: ..."``, a user-code traceback, then Dynamo's own traceback.
"""

from __future__ import annotations

import re
from typing import Any

MAX_DIFFS = 4          # differences named in one line; the rest are counted
MAX_VALUE_CHARS = 60   # longer values are shortened in explanations

_COMPONENT = re.compile(r"^\[(?P<hash>[0-9a-z]+)\] (?P<name>[^:\n]+?): ?(?P<value>.*)$", re.S)
_TENSOR_FIELD = {
    "dtype": re.compile(r"dtype=([\w.]+)"),
    "shape": re.compile(r"shape=torch\.Size\(\[([^\]]*)\]\)"),
    "stride": re.compile(r"stride=\(([^)]*)\)"),
    "device": re.compile(r"device=device\(type='([^']+)'(?:, index=(\d+))?\)"),
}
_GB_LOCATION = re.compile(r"Graph break in user code at (?P<file>.+?):(?P<line>\d+)")
_GB_REASON = re.compile(r"Graph Break Reason: (?P<reason>.*?)(?:\n\s*User code traceback:|\nTraceback \(most|\Z)", re.S)
_TB_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')
_GUARD_PREFIX = re.compile(r"^\s*(?:!\d+/)?\d+/\d+:\s*")
_SOURCE_NAME = re.compile(r"^L\['([^']+)'\]$")


# -- cache key components --------------------------------------------------------------------
def parse_components(lines: list[str] | None) -> dict[str, tuple[str, str]]:
    """``{name: (hash, value)}`` from FxGraphHashDetails debug lines; unparsable lines are skipped."""
    out: dict[str, tuple[str, str]] = {}
    for line in lines or ():
        if not isinstance(line, str):
            continue
        m = _COMPONENT.match(line)
        if m:
            out[m.group("name").strip()] = (m.group("hash"), m.group("value"))
    return out


def tensor_metadata(value: str) -> dict[str, str] | None:
    """Shape, dtype, stride and device of a ``TensorMetadata(...)`` component value."""
    if "TensorMetadata(" not in value:
        return None
    meta: dict[str, str] = {}
    for field, pattern in _TENSOR_FIELD.items():
        m = pattern.search(value)
        if m:
            meta[field] = ":".join(g for g in m.groups() if g) if field == "device" else m.group(1)
    return meta


def _short(value: str) -> str:
    value = " ".join(value.split())
    return value if len(value) <= MAX_VALUE_CHARS else value[: MAX_VALUE_CHARS - 1] + "…"


def describe_component_change(name: str, old: str | None, new: str | None) -> str:
    """One phrase for one differing key component, in the user's words."""
    if old is None:
        return f"new key component {name}"
    if new is None:
        return f"key component {name} gone"
    if name == "gm":
        return "graph code changed"
    if name.startswith("example_inputs["):
        return _describe_input_change(name[len("example_inputs["):-1], old, new)
    if name == "torch_version":
        return "torch version changed"
    if name.startswith("system_info"):
        return "system (compiler/device) info changed"
    if name.startswith("inductor_config["):
        return f"Inductor config {name[len('inductor_config['):-1]}: {_short(old)} -> {_short(new)}"
    return f"{name}: {_short(old)} -> {_short(new)}"


def _describe_input_change(index: str, old: str, new: str) -> str:
    a, b = tensor_metadata(old), tensor_metadata(new)
    if a is None or b is None:
        return f"input {index}: {_short(old)} -> {_short(new)}"
    parts = [f"{field} [{a.get(field, '?')}] -> [{b.get(field, '?')}]" if field in ("shape", "stride")
             else f"{field} {a.get(field, '?')} -> {b.get(field, '?')}"
             for field in ("shape", "dtype", "stride", "device") if a.get(field) != b.get(field)]
    return f"input {index} " + (", ".join(parts) if parts else "metadata changed")


def diff_components(previous: dict[str, tuple[str, str]], current: dict[str, tuple[str, str]]) -> list[str]:
    """Phrases for every component whose hash differs: inputs first, then graph, versions, config."""
    phrases = _diff_inputs(previous, current)
    others = [n for n in current if not n.startswith("example_inputs[") and previous.get(n, (None,))[0] != current[n][0]]
    others += [n for n in previous if not n.startswith("example_inputs[") and n not in current]
    others.sort(key=_component_rank)
    phrases += [describe_component_change(n, previous.get(n, (None, None))[1], current.get(n, (None, None))[1])
                for n in others]
    return phrases


def _example_inputs(components: dict[str, tuple[str, str]]) -> tuple[list[tuple[str, str]], list[str]]:
    """``([(hash, TensorMetadata value), ...], [size-symbol values])`` in input order."""
    entries = sorted(((int(n[len("example_inputs["):-1]), hv) for n, hv in components.items()
                      if n.startswith("example_inputs[") and n[len("example_inputs["):-1].isdigit()))
    tensors = [hv for _, hv in entries if "TensorMetadata(" in hv[1]]
    symbols = [hv[1].strip("()',") for _, hv in entries if "TensorMetadata(" not in hv[1]]
    return tensors, symbols


def _diff_inputs(previous: dict[str, tuple[str, str]], current: dict[str, tuple[str, str]]) -> list[str]:
    """Tensor inputs compared in order (size-symbol inputs that dynamic shapes add are named apart)."""
    old_tensors, old_symbols = _example_inputs(previous)
    new_tensors, new_symbols = _example_inputs(current)
    phrases = []
    if len(old_tensors) != len(new_tensors):
        phrases.append(f"number of tensor inputs {len(old_tensors)} -> {len(new_tensors)}")
    for i, (old, new) in enumerate(zip(old_tensors, new_tensors, strict=False)):
        if old[0] != new[0]:
            phrases.append(_describe_input_change(str(i), old[1], new[1]))
    added = [s for s in new_symbols if s not in old_symbols]
    if added:
        phrases.append("new size symbol" + ("s " if len(added) > 1 else " ") + ", ".join(added) + " (dynamic shapes)")
    return phrases


def _component_rank(name: str) -> tuple[int, str]:
    for rank, prefix in enumerate(("example_inputs", "gm", "torch_version", "system_info", "inductor_config")):
        if name.startswith(prefix):
            return rank, name
    return 5, name


def join_limited(phrases: list[str], limit: int = MAX_DIFFS) -> str:
    """``a; b; c (+N more)``."""
    head = "; ".join(phrases[:limit])
    return head + (f" (+{len(phrases) - limit} more)" if len(phrases) > limit else "")


def explain_cache_miss(kind: str, label: str, key: str | None, status: str | None, *,
                       has_previous: bool, previous: dict[str, tuple[str, str]] | None,
                       current: dict[str, tuple[str, str]], input_changes: list[str]) -> str:
    """Why a cache (``kind``: "FX graph" or "AOTAutograd") missed for compile ``label``.

    Compared with the previous compile of the same frame: the key components that differ when
    both compiles logged them (FX graph cache), else the inputs whose shape/dtype/stride changed.
    """
    what = f"{kind} cache miss for {label}"
    if status and status not in ("miss", "full_miss"):
        what += f" [{status}]"
    key_part = f" (key {key[:10]})" if key else ""
    if not has_previous:
        return f"{what}: first compile of this frame in the session, no cache entry for this key{key_part}"
    phrases = diff_components(previous, current) if previous and current else []
    if not phrases and input_changes:
        phrases = input_changes
    if not phrases:
        return f"{what}: key differs from the previous compile of this frame{key_part}"
    return f"{what}: {join_limited(phrases)}{key_part}"


# -- recompiles -------------------------------------------------------------------------------
def guard_reasons(payload: Any) -> list[str]:
    """Guard-failure reasons from a ``recompile_reasons`` payload (a string or a JSON list)."""
    if payload is None:
        return []
    if isinstance(payload, list):
        return [str(p).strip() for p in payload if str(p).strip()]
    text = str(payload).strip()
    if text.startswith("["):
        import json

        try:
            loaded = json.loads(text)
            return guard_reasons(loaded) if isinstance(loaded, list) else [text]
        except ValueError:
            pass
    if text.startswith('"') and text.endswith('"'):
        text = text[1:-1]
    return [text] if text else []


def source_name(source: str) -> str:
    """``L['x']`` -> ``x``; other guard sources are kept as written."""
    m = _SOURCE_NAME.match(source)
    return m.group(1) if m else source


def diff_inputs(previous: dict[str, dict[str, Any]], current: dict[str, dict[str, Any]]) -> list[str]:
    """Phrases for inputs whose shape, dtype or stride changed between two compiles of a frame."""
    phrases = []
    for name, cur in current.items():
        old = previous.get(name)
        if old is None:
            continue
        parts = [f"{label} changed {_fmt(old.get(field))} -> {_fmt(cur.get(field))}"
                 for field, label in (("size", "shape"), ("dtype", "dtype"), ("stride", "stride"))
                 if old.get(field) != cur.get(field)]
        if parts:
            phrases.append(f"input {source_name(name)} " + ", ".join(parts))
    return phrases


def _fmt(value: Any) -> str:
    return "[" + ", ".join(str(v) for v in value) + "]" if isinstance(value, (list, tuple)) else str(value)


def explain_recompile(label: str, guards: list[str], input_changes: list[str]) -> str:
    """``recompile of f (0/1): input x shape [4, 8] -> [6, 8] (guard: tensor 'x' size mismatch ...)``."""
    guard = _GUARD_PREFIX.sub("", guards[0]) if guards else None
    head = f"recompile of {label}"
    what = join_limited(input_changes) if input_changes else None
    if what and guard:
        return f"{head}: {what} (guard: {guard})"
    if guard:
        more = f" (+{len(guards) - 1} more cache entries failed)" if len(guards) > 1 else ""
        return f"{head}: guard failed: {guard}{more}"
    if what:
        return f"{head}: {what}"
    return f"{head}: guard failure reason not reported by this torch version"


# -- graph breaks -----------------------------------------------------------------------------
def parse_graph_break(payload: str | None) -> tuple[str, str | None, str]:
    """``(reason, "file:line" or None, detail)`` from a ``dynamo_graph_break_reason`` payload."""
    text = payload or ""
    location = None
    m = _GB_LOCATION.search(text)
    if m:
        location = f"{m.group('file')}:{m.group('line')}"
    else:
        frames = _TB_FRAME.findall(text.split("Traceback (most recent call last)")[0])
        if frames:
            location = f"{frames[-1][0]}:{frames[-1][1]}"
    r = _GB_REASON.search(text)
    detail = (r.group("reason") if r else text.split("\nTraceback (most recent call last)")[0]).strip()
    return _concise_reason(detail), location, detail[:2000]


def _concise_reason(detail: str) -> str:
    """The graph-break type and Dynamo's explanation, without hints and links."""
    lines = [ln.strip() for ln in detail.splitlines() if ln.strip()]
    if not lines:
        return "graph break (no reason given)"
    if lines[0].startswith("Encountered graph break when attempting") and len(lines) > 1:
        lines = lines[1:]
    head = lines[0]
    explanation = next((ln[len("Explanation:"):].strip() for ln in lines if ln.startswith("Explanation:")), None)
    return f"{head}: {explanation}" if explanation and explanation not in head else head
