"""Numbers into words for people: rates, durations, sizes, shares; and text from the data (file
names, labels, messages quoting them) made safe to show. Only ever used to render."""

from __future__ import annotations

import re
from typing import Any

from rich.markup import escape

from feedbench.core.redact import map_strings
from feedbench.core.timeline import MonitorSample
from feedbench.core.words import count, setup_text
from feedbench.scan.results import measured_steps, step_alone_moved

__all__ = ["count", "setup_text"]  # words for counts live in core: the verdict uses them too

# C0 and C1 controls (line breaks, ESC), the Unicode line and paragraph separators, and the
# bidirectional overrides that reorder what follows them on screen
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escaped(m: re.Match[str]) -> str:
    c = m.group()
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def visible(text: str) -> str:
    """``text`` with every control character written as its escape (``\\n``, ``\\x1b``): a
    file named ``x.jpg\\nverdict: …`` shows as one name, never as a line of its own, and
    colours nothing."""
    return _CONTROL.sub(_escaped, text)


def shown(result: Any) -> Any:
    """A copy of a results object with :func:`visible` applied to every string: what every
    renderer (console, HTML, Markdown, CSV) and figure starts from. The monitor's readings
    (numbers only, thousands of them a measurement) are shared with ``result``, not copied."""
    return map_strings(result, visible, keep=(MonitorSample,))


def plain(text: Any) -> str:
    """Text from the data for a rich console string: control characters visible, and any
    ``[bold]`` in it shown as written, not read as markup."""
    return escape(visible(str(text)))


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "—"
    if x >= 10_000:
        return f"{x / 1000:,.1f}k"
    if x >= 100:
        return f"{x:,.0f}"
    return f"{x:,.1f}"


def fmt_s(x: float | None) -> str:
    if x is None:
        return "—"
    if 0 < x < 0.5e-6:  # a time that was taken, under the unit shown
        return "<1 µs"
    if x < 1e-3:
        return f"{x * 1e6:.0f} µs"
    if x < 1:
        return f"{x * 1e3:.1f} ms"
    return f"{x:.2f} s"


def fmt_bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def fmt_pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.0%}"


def fmt_ms(x: float | None) -> str:
    if x is None:
        return "—"
    return f"{x * 1e3:.2f}" if abs(x) < 0.01 else f"{x * 1e3:.1f}"


def fed_text(value: float | None, std: float | None = None) -> str:
    """Accelerators fed, as a reader wants it: 0.06, 3.4 ± 0.2 (no spread shown under 0.05)."""
    if value is None:
        return "— (no step)"
    digits = 2 if value < 1 else 1
    spread = f" ± {std:.{digits}f}" if std and std >= 0.05 else ""
    return f"{value:.{digits}f}{spread}"


def rate_bound_text(by_au: float | None, by_rate: float | None) -> str:
    """Why accelerators fed is under the AU's figure: the measured rate bounds it."""
    return (
        f"bounded by the measured samples/s; the AU alone said {fed_text(by_au)}"
        if by_au is not None and by_rate is not None
        else ""
    )


def supported_text(n: int | None, at_least: bool = False) -> str:
    """Supported consumers: "4", or "≥ 4" where find-max stopped at an undecided count (the
    answer is a lower bound), "undecided" where it stopped before any count passed."""
    if n is None:
        return "undecided" if at_least else "—"
    return f"≥ {n}" if at_least else str(n)


def _drift_text(gpu) -> str:
    """ ", up to 7% apart before and after a pass": the step alone measured on both sides of a
    pass moved that much (its mean is the length used); said from verify's ceiling's share."""
    from feedbench.verify.analysis import DRIFT_SAID

    apart = 2 * max((step_alone_moved(s) for s in gpu), default=0.0)  # of their mean
    if apart < DRIFT_SAID:
        return ""
    return f", up to {apart:.0%} apart before and after a pass"


def emulation_text(measurements) -> str | None:
    """How the step was emulated, from the consumers' results: a sleep (blind to a loader
    slowing the step), or kernels on the GPU with the step's measured cost from the loader."""
    stats = [s for m in measurements for s in m.per_consumer if s.emulate]
    if not stats:
        return None
    if all(s.emulate == "sleep" for s in stats):
        return "a sleep (sees waiting only, not a loader slowing the step: --emulate gpu on a GPU)"
    gpu = [s for s in stats if s.emulate == "gpu"]
    steps = sum(measured_steps(s) for s in gpu)
    extra = sum(s.step_extra_s for s in gpu) / steps
    models = {s.step_model for s in gpu if s.step_model}
    alone = [s.step_alone_s for s in gpu if s.step_alone_s]
    what = (
        f"a real {'/'.join(sorted(models))} training step on each consumer's GPU"
        if models
        else "kernels on each consumer's GPU"
    )
    if alone:
        what += (
            f" ({min(alone) * 1e3:.1f}"
            + (f"–{max(alone) * 1e3:.1f}" if max(alone) - min(alone) >= 5e-5 else "")
            + " ms alone here"
            + _drift_text(gpu)
            + ")"
        )
    return (
        f"{what}; the loader made a step {extra * 1e3:.1f} ms longer than alone "
        "(counted against AU)"
    )
