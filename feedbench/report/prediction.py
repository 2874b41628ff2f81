"""Scan's prediction against verify's measurement: for the same loader and GPU count, the data
wait a scan predicts (1 − AU of its emulated step) beside the data-wait share verify measured in
real training, and how far apart they are.

A scan emulates the accelerator with a fixed step; verify trains for real. Where verify's compute
step (its step less the data wait) differs from the scan's emulated step, the prediction was
made for another appetite: the pair shows both steps, so a reader can see it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console

from feedbench.core import envelope
from feedbench.core.envelope import Envelope
from feedbench.core.errors import FeedbenchError
from feedbench.scan.results import ScanResult, step_alone_moved
from feedbench.scan.sizing import short_window
from feedbench.scan.sweep import in_curve
from feedbench.verify.results import VerifyResult

# a scan's --loader naming the stock recipe that verify calls "baseline"
STOCK_FACTORY = "feedbench.verify.loaders:stock_loader"
AGREE_POINTS = 5.0  # issue 17's bar: predicted and measured data wait within 5 points


@dataclass
class Prediction:
    loader: str
    gpus: int
    pass_name: str  # the scan's pass the prediction is taken from
    scan_label: str
    verify_label: str
    predicted_au: float
    predicted_wait: float  # 1 − AU
    scan_step_s: float | None  # the emulated step
    measured_wait: float  # Σ data wait / Σ step, mean over ranks
    measured_wait_max: float | None  # the worst rank
    verify_compute_step_s: float | None  # verify's step less its data wait
    ceiling_fraction: float | None  # paired in one process where verify ran --interleave
    same_data: bool
    # |AU − fraction of the ceiling| where verify ran its synthetic ceiling (the step a loader
    # slows counts there as in the AU of --emulate gpu), else |predicted − measured| data wait;
    # in percentage points
    difference_points: float
    # why the scan's point is no basis for a prediction (its window too short), or None
    not_judged: str | None = None
    # ± points verify's fraction of its ceiling is resolved to: half the change of its synthetic
    # ceiling between its runs before and after the loaders (the host's drift; 0: one run, or
    # no ceiling compared), or with --interleave half its paired fraction's 95% interval
    resolution_points: float = 0.0
    # ± points the scan's AU is resolved to: half the range of its repeats' AUs at this point,
    # or what its step alone moved over a pass where that is more (0: neither)
    scan_resolution_points: float = 0.0
    # points verify's fraction may overstate the loader: its window still drained a queue filled
    # before it (in a slow step), down to its last quarter's pace (``VerifyRun.drain``; 0: none)
    verify_drain_points: float = 0.0
    paired: bool = False  # verify's fraction is paired in one process (``--interleave``)

    @property
    def agrees(self) -> bool | None:
        """Within AGREE_POINTS; False beyond them by more than verify's resolution; None where
        the scan's point cannot be judged by, or where verify's drift leaves it open."""
        if self.not_judged or self.unresolved:
            return None
        return self.difference_points <= AGREE_POINTS

    @property
    def unresolved(self) -> bool:
        """More than AGREE_POINTS apart, but by less than the two results' own resolution: the
        host's drift between verify's ceiling runs, and the spread of the scan's repeats, could
        make the whole difference."""
        margin = self.resolution_points + self.scan_resolution_points + self.drain_margin
        return AGREE_POINTS < self.difference_points <= AGREE_POINTS + margin

    @property
    def drain_margin(self) -> float:
        """verify's drain points where they count: a drain only overstates verify, so only a
        prediction below its fraction of the ceiling may be that much lower."""
        below = self.ceiling_fraction is not None and self.predicted_au < self.ceiling_fraction
        return self.verify_drain_points if below else 0.0

    @property
    def verdict(self) -> str:
        if self.unresolved and not self.not_judged:
            return "unresolved"
        return {True: "agree", False: "disagree", None: "not judged"}[self.agrees]


@dataclass
class PredictionCheck(Envelope):
    """``feedbench compare scan.json verify.json``: every pair of the same loader and count."""

    pass_name: str
    pairs: list[Prediction] = field(default_factory=list)
    unpaired: list[str] = field(default_factory=list)  # what found no partner, in words


def loader_key(scan: ScanResult) -> str | None:
    """The name verify knows the scan's loader by (None: scan's own pipeline, nothing to pair)."""
    loader = scan.config.get("loader")
    if loader is None:
        return None
    return "baseline" if loader == STOCK_FACTORY else loader


def predictions(
    scans: list[tuple[str, ScanResult]], verifies: list[tuple[str, VerifyResult]], pass_name: str
) -> list[Prediction]:
    """Every (scan curve point, verify run) pair of the same loader and count, in scan order."""
    out = []
    for s_label, scan in scans:
        key = loader_key(scan)
        points = [p for p in scan.curve if p.pass_name == pass_name and p.au_mean is not None]
        for point in points:
            for v_label, ver in verifies:
                for run in ver.runs:
                    if run.loader != key or run.gpus != point.consumers:
                        continue
                    if run.status != "ok" or run.data_wait_fraction is None:
                        continue
                    out.append(_pair(s_label, scan, point, v_label, ver, run))
    return out


def _step_alone(scan, point) -> float | None:
    """The emulated step as this point's consumers timed it alone (``--emulate gpu``: the
    model's real step on this host, which the profile's figure may not be), their median."""
    alone = sorted(
        c.step_alone_s
        for m in scan.measurements
        if m.consumers == point.consumers and m.pass_name == point.pass_name
        for c in m.per_consumer
        if getattr(c, "step_alone_s", None)
    )
    return alone[len(alone) // 2] if alone else None


def _pair(s_label, scan, point, v_label, ver, run) -> Prediction:
    b = run.breakdown
    compute = (b.step_s - b.data_wait_s) if b is not None else None
    step = _step_alone(scan, point) or (scan.accelerator or {}).get("step_s")
    wait = 1.0 - point.au_mean
    return Prediction(
        loader=run.loader,
        gpus=run.gpus,
        pass_name=point.pass_name,
        scan_label=s_label,
        verify_label=v_label,
        predicted_au=point.au_mean,
        predicted_wait=wait,
        scan_step_s=step,
        measured_wait=run.data_wait_fraction,
        measured_wait_max=run.data_wait_fraction_max,
        verify_compute_step_s=compute,
        ceiling_fraction=_fraction(run),
        same_data=_same_data(scan, run),
        difference_points=_difference(point.au_mean, run),
        not_judged=_short(scan, point),
        resolution_points=_resolution(ver, run),
        scan_resolution_points=_scan_resolution(scan, point),
        verify_drain_points=_drain_points(run),
        paired=run.paired is not None,
    )


def _fraction(run) -> float | None:
    """verify's fraction of its ceiling: paired block by block in one process where it ran
    ``--interleave`` (the host's drift between runs left out), else against its ceiling run."""
    return run.paired.ceiling_fraction if run.paired is not None else run.ceiling_fraction


def _resolution(ver, run) -> float:
    """± points of ``run``'s fraction of the ceiling: half its synthetic run's drift (verify's
    ``--ceiling-twice``), where the difference is taken against that fraction."""
    if run.paired is not None:
        lo, hi = run.paired.ceiling_fraction_lo, run.paired.ceiling_fraction_hi
        return (hi - lo) / 2 * 100 if lo is not None and hi is not None else 0.0
    if run.ceiling_fraction is None:
        return 0.0
    drift = next(
        (r.ceiling_drift for r in ver.runs
         if r.loader == "synthetic" and r.gpus == run.gpus and r.ceiling_drift is not None),
        0.0,
    )  # fmt: skip
    return abs(drift) / 2 * 100


def _scan_resolution(scan: ScanResult, point) -> float:
    """± points of the scan's AU at ``point``: half the range of its repeats' AUs (a repeat
    whose start-up or host differed moves the mean by that much), or, where larger, what the
    repeats' step alone moved between before and after their passes, on average (the bound of
    their mean AU). The AU is the step alone over the step, and the step alone is the mean of
    the two: a host that changed speed during a pass leaves its AU that uncertain, as verify's
    ceiling's drift leaves its fraction."""
    key = (point.consumers, point.pass_name)
    ms = [
        m
        for m in scan.measurements
        if (m.consumers, m.pass_name) == key and in_curve(m) and m.au_mean is not None
    ]
    aus = [m.au_mean for m in ms]
    spread = (max(aus) - min(aus)) / 2 * 100 if len(aus) > 1 else 0.0
    drift = sum(m.au_mean * _alone_drift(m) * 100 for m in ms) / len(ms) if ms else 0.0
    return max(spread, drift)


def _alone_drift(m) -> float:
    """The most a consumer's step alone moved over the pass, as a share (``step_alone_moved``)."""
    return max((step_alone_moved(c) for c in getattr(m, "per_consumer", None) or []), default=0.0)


def _drain_points(run) -> float:
    """Points between verify's fraction of the ceiling and its last quarter's, where its
    window still drained a queue filled before it: the fraction is no finer than that."""
    d = run.drain
    if d is None or run.ceiling_fraction is None:
        return 0.0
    return max(0.0, run.ceiling_fraction - d.last_quarter_ceiling_fraction) * 100


def _difference(au: float, run) -> float:
    """Points between the scan's AU and verify's fraction of its synthetic ceiling, the whole
    loss a loader causes (waiting, and a step it slows); without a ceiling, the data waits."""
    fraction = _fraction(run)
    if fraction is not None:
        return abs(au - min(fraction, 1.0)) * 100
    return abs((1.0 - au) - run.data_wait_fraction) * 100


def _short(scan: ScanResult, point) -> str | None:
    """Why the point's AU is no prediction: a repeat's measured window held too few batches
    per batch its loader can have ready (the sizing rule: prefetched batches then decide the AU)."""
    key = (point.consumers, point.pass_name)
    ms = [m for m in scan.measurements if (m.consumers, m.pass_name) == key and not m.failed]
    short = [s for m in ms if (s := short_window(m, scan.config)) is not None]
    if not short:
        return None
    k, need = min(short)
    return f"the scan measured {k} batch{'es' if k != 1 else ''} per consumer (needs ≥ {need})"


def _same_data(scan: ScanResult, run) -> bool:
    """Whether verify's run read what the scan read (the run's own source, else verify's data):
    a scan of a sample's root read its images/ or its shards/ folder, as its format says."""
    from loaders.data.layout import SAMPLE_SHARDS, SAMPLE_TREE

    if run.source is None:
        return False
    root = _norm(scan.dataset.path)
    folder = {"tree": SAMPLE_TREE, "shards": SAMPLE_SHARDS}.get(scan.dataset.format)
    read = {root} | ({f"{root}/{folder}"} if folder else set())
    return _norm(run.source) in read


def _norm(path: str) -> str:
    return str(path).rstrip("/")


def sentence(p: Prediction) -> str:
    """One line: prediction, measurement, difference."""
    steps = ""
    if p.scan_step_s and p.verify_compute_step_s:
        steps = (
            f" (emulated step {p.scan_step_s * 1e3:.1f} ms, verify's compute step "
            f"{p.verify_compute_step_s * 1e3:.1f} ms)"
        )
    ceiling = ""
    if p.ceiling_fraction:
        paired = " (paired in one process)" if p.paired else ""
        ceiling = f", {p.ceiling_fraction:.2f} of the synthetic ceiling{paired}"
    spread = f" ± {p.scan_resolution_points / 100:.3f}" if p.scan_resolution_points else ""
    data = "" if p.same_data else "; not the same data path"
    verdict = f"not judged: {p.not_judged}" if p.not_judged else _verdict_text(p)
    return (
        f"{p.loader} at {p.gpus} GPU{'s' if p.gpus != 1 else ''}: scan predicted AU "
        f"{p.predicted_au:.3f}{spread} ({p.predicted_wait:.1%} data wait, {p.pass_name} pass)"
        f"{steps}; "
        f"verify measured {p.measured_wait:.1%} data wait{ceiling}: {verdict}{data}"
    )


def _verdict_text(p: Prediction) -> str:
    apart = f"{p.difference_points:.1f} points apart"
    if not p.unresolved:
        return f"{p.verdict}: {apart}"
    why = []
    if p.resolution_points and p.paired:
        why.append(f"verify's paired fraction is known to ±{p.resolution_points:.0f} points (95%)")
    elif p.resolution_points:
        why.append(
            "verify's ceiling moved between its runs before and after the loaders: fractions "
            f"of it ±{p.resolution_points:.0f} points"
        )
    if p.scan_resolution_points:
        why.append(
            f"the scan's AU is known to ±{p.scan_resolution_points:.0f} points (its repeats' "
            "spread, or its step alone's change over a pass)"
        )
    if p.drain_margin:
        why.append(
            "verify's window still drained a queue its loader filled before it: its last "
            f"quarter ran {p.verify_drain_points:.0f} points below the whole"
        )
    return f"unresolved: {apart}, within the results' own resolution ({'; '.join(why)})"


AGREE_CELL = {"agree": "yes", "disagree": "NO", "not judged": "n/a", "unresolved": "±"}


def check(
    scans: list[tuple[str, str]], verifies: list[tuple[str, str]], pass_name: str
) -> PredictionCheck:
    """Load (label, path) of scan and verify results files and pair them; one clear error where
    nothing pairs."""
    from feedbench.scan import results as scan_results
    from feedbench.verify import results as verify_results

    if not scans or not verifies:
        raise FeedbenchError("a prediction check takes scan results and verify results files")
    s = [(label, scan_results.load(path)) for label, path in scans]
    v = [(label, verify_results.load(path)) for label, path in verifies]
    pairs = predictions(s, v, pass_name)
    paired = {(p.scan_label, p.gpus) for p in pairs}
    unpaired = [
        f"{label}: {loader_key(scan) or 'scan pipeline (no --loader)'} at {pt.consumers} "
        f"consumer{'s' if pt.consumers != 1 else ''}: no verify run of that loader and count"
        for label, scan in s
        for pt in scan.curve
        if pt.pass_name == pass_name and (label, pt.consumers) not in paired
    ]
    if not pairs:
        have = sorted({f"{r.loader}@{r.gpus}" for _, ver in v for r in ver.runs})
        raise FeedbenchError(
            f"no scan and verify run share a loader and count in the {pass_name} pass (verify "
            f"ran {', '.join(have) or 'nothing'}; scan with --loader NAME, or "
            f"--loader {STOCK_FACTORY} for baseline)"
        )
    files = [p for _, p in scans] + [p for _, p in verifies]
    return PredictionCheck(
        **envelope.envelope("prediction", {"files": files}),
        pass_name=pass_name,
        pairs=pairs,
        unpaired=unpaired,
    )


def render(check_: PredictionCheck, console: Console) -> None:
    from rich.table import Table

    from feedbench.report.fmt import plain, shown

    check_ = shown(check_)  # names from the data: one line each, never markup
    t = Table(title=f"scan's prediction against verify's training ({plain(check_.pass_name)} pass)")
    for col in ("loader", "GPUs", "predicted AU", "predicted wait", "measured wait (worst rank)",
                "of ceiling", "difference", "agree"):  # fmt: skip
        t.add_column(col, justify="left" if col == "loader" else "right")
    for p in check_.pairs:
        worst = f" ({p.measured_wait_max:.1%})" if p.measured_wait_max is not None else ""
        t.add_row(
            plain(p.loader), str(p.gpus), f"{p.predicted_au:.3f}", f"{p.predicted_wait:.1%}",
            f"{p.measured_wait:.1%}{worst}",
            f"{p.ceiling_fraction:.2f}" if p.ceiling_fraction is not None else "—",
            f"{p.difference_points:.1f} pt", AGREE_CELL[p.verdict],
        )  # fmt: skip
    console.print(t)
    for p in check_.pairs:
        console.print(plain(sentence(p)))
    for line in check_.unpaired:
        console.print(f"unpaired: {plain(line)}")


def load(path: str | os.PathLike[str], data: dict[str, Any] | None = None) -> PredictionCheck:
    return envelope.load(path, "prediction", PredictionCheck, data)


def prediction_document(check_: PredictionCheck, source: str):
    """The check as a document (page, Markdown, CSV): one row per pair."""
    from pathlib import Path

    from feedbench.report.doc import Document, Shown, Table, command_text, dash

    rows = [vars(p) | {"agrees": p.agrees, "verdict": p.verdict} for p in check_.pairs]
    pct = lambda x: f"{x:.1%}"  # noqa: E731
    table = Table(
        title="Scan's prediction beside verify's training, per loader and GPU count",
        rows=rows,
        columns=[
            Shown("loader", lambda r: r["loader"], "left"),
            Shown("GPUs", lambda r: str(r["gpus"])),
            Shown("predicted AU", lambda r: f"{r['predicted_au']:.3f}"),
            Shown("predicted wait", lambda r: pct(r["predicted_wait"])),
            Shown("measured wait", lambda r: pct(r["measured_wait"])),
            Shown("of ceiling", lambda r: dash(r["ceiling_fraction"], lambda x: f"{x:.2f}")),
            Shown("difference", lambda r: f"{r['difference_points']:.1f} pt"),
            Shown("agree", lambda r: AGREE_CELL[r["verdict"]].lower()),
        ],
        csv=[
            ("loader", "loader"),
            ("GPUs", "gpus"),
            ("predicted AU (0-1)", "predicted_au"),
            ("predicted data wait (0-1)", "predicted_wait"),
            ("measured data wait (0-1)", "measured_wait"),
            ("measured data wait, worst rank (0-1)", "measured_wait_max"),
            ("fraction of synthetic ceiling (0-1)", "ceiling_fraction"),
            ("emulated step (s)", "scan_step_s"),
            ("verify compute step (s)", "verify_compute_step_s"),
            ("difference (points)", "difference_points"),
            ("same data", "same_data"),
            ("agree", "agrees"),
            ("verdict", "verdict"),
            ("verify's resolution (± points)", "resolution_points"),
            ("scan's resolution (± points)", "scan_resolution_points"),
            ("verify's queue drain (points)", "verify_drain_points"),
            ("not judged (why)", "not_judged"),
        ],  # fmt: skip
        note=f"Predicted wait: 1 − the scan's AU ({check_.pass_name} pass); measured wait: "
        f"verify's data-wait share of the step; they agree within {AGREE_POINTS:g} points; "
        "±: further apart, but by less than the results' own resolution (verify's ceiling "
        "moved between its runs before and after the loaders, the scan's repeats spread or "
        "its step alone moved over a pass, or "
        "verify's window still drained a queue its loader filled before it); "
        "n/a: the scan's window held too few batches to predict by (5 per batch its loader "
        "can have ready).",
    )
    return Document(
        kind="prediction",
        title="Did the scan predict the training run?",
        subtitle=f"feedbench compare · {Path(source).name} · {check_.created_utc}",
        answer=[sentence(p) for p in check_.pairs],
        valid=None,
        broken=[],
        summary=table,
        warnings=list(check_.unpaired) + list(check_.warnings),
        command=command_text(check_.command),
        created_utc=check_.created_utc,
        tool_version=check_.tool_version,
    )
