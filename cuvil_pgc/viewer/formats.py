"""How figures read in every table and report: durations, rates, long names and values cut short."""

from __future__ import annotations

import json
from typing import Any


def fmt_us(us: float | None) -> str:
    """µs as a short human figure: 850 µs, 12.3 ms, 4.56 s."""
    if us is None:
        return "-"
    if abs(us) >= 1e6:
        return f"{us / 1e6:.3g} s"
    if abs(us) >= 1e3:
        return f"{us / 1e3:.3g} ms"
    return f"{us:.3g} µs"


def fmt_ms(ms: Any) -> str:
    """ms (as plan.json and the compile summary give them) as :func:`fmt_us` shows time; ``-`` for
    anything not a number."""
    return "-" if not isinstance(ms, (int, float)) or isinstance(ms, bool) else fmt_us(float(ms) * 1e3)


def fmt_rate(x: float | None, unit: str) -> str:
    """A rate with an SI prefix and three significant digits: ``12.3 GB/s``."""
    if x is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {prefix}{unit}"
    return f"{x:.3g} {unit}"


def short_name(name: str, limit: int = 48) -> str:
    """Long kernel names (templates) cut to ``limit`` characters."""
    return name if len(name) <= limit else name[:limit - 1] + "…"


def clip(value: Any, limit: int = 200) -> str:
    """A string, or any value as JSON, cut to ``limit`` characters."""
    s = value if isinstance(value, str) else json.dumps(value, default=str, ensure_ascii=False)
    return s if len(s) <= limit else s[: limit - 1] + "…"


def fastest_first(medians: dict[str, float | None]) -> list[tuple[str, float | None]]:
    """A race's (contender, median) pairs, fastest first (plan.json keeps them sorted by name)."""
    return sorted(medians.items(), key=lambda kv: (kv[1] is None, kv[1] or 0.0))
