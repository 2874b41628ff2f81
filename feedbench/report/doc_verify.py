"""A verify's results as a :class:`~feedbench.report.doc.Document`: the summary first, one row
per DDP training run, the host, the settings, the warnings and the command."""

from __future__ import annotations

from pathlib import Path

from feedbench.report.doc import Document, Row, Shown, SystemBlock, Table, command_text, dash
from feedbench.report.fmt import fmt_bytes, fmt_rate
from feedbench.report.sut import system_facts
from feedbench.report.verify_console import ran_with, tuned_settings
from feedbench.verify.analysis import loaders_in
from feedbench.verify.results import VerifyResult, VerifyRun, unit_plural


def verify_document(result: VerifyResult, source: str) -> Document:
    cfg = result.config
    unit = cfg.get("unit", "GPU")
    facts, flags = system_facts(result)
    ds = result.dataset
    method = [
        (
            "model",
            f"{cfg.get('model')} at {cfg.get('image_size')} px on {cfg.get('device')} "
            f"({cfg.get('backend')}, {cfg.get('precision')})",
        ),
        (
            "scaling",
            f"{cfg.get('scaling')}: batch {cfg.get('batch_size')}"
            + (f" per {unit}" if cfg.get("scaling") == "weak" else " in all"),
        ),
        ("steps", f"{cfg.get('steps')} measured after {cfg.get('warmup')} warm-up"),
    ]
    if ds is not None:
        method.insert(0, ("data", f"{ds.path}: {ds.format}, {ds.files:,} files, "
                                  f"{fmt_bytes(ds.bytes)}"))  # fmt: skip
    method += [("setting", s) for s in tuned_settings(cfg)]
    method += [("ran with", s) for s in ran_with(result.runs, unit)]
    return Document(
        kind="verify",
        title="Does DDP training scale with these loaders?",
        subtitle=f"feedbench verify · {Path(source).name} · {result.created_utc}",
        answer=([result.summary] if result.summary else []) + [v.text for v in result.verdicts],
        valid=None,
        broken=[],
        summary=runs_table(result, unit),
        systems=[SystemBlock("System under test", facts, flags)],
        method=method,
        warnings=[r.error for r in result.runs if r.error] + list(result.warnings),
        command=command_text(result.command),
        created_utc=result.created_utc,
        tool_version=result.tool_version,
    )


def _row(r: VerifyRun) -> Row:
    return {
        "loader": r.loader, "gpus": r.gpus, "status": r.status, "global_batch": r.global_batch,
        "images_per_s": r.images_per_s or None, "speedup": r.speedup,
        "efficiency": r.efficiency, "ceiling": r.ceiling_fraction,
        "data_wait": r.data_wait_fraction, "gpu_util": r.gpu_util_percent_mean,
        "busy_cores": r.busy_cores_mean, "steal_cores": r.steal_cores_mean,
        "step_ms": r.breakdown.step_s * 1e3 if r.breakdown else None,
        "loader_settings": r.loader_settings,
    }  # fmt: skip


VERIFY_CSV = [
    ("loader", "loader"),
    ("ranks", "gpus"),
    ("status", "status"),
    ("global batch", "global_batch"),
    ("images/s", "images_per_s"),
    ("speedup (x)", "speedup"),
    ("efficiency (0-1)", "efficiency"),
    ("fraction of synthetic ceiling (0-1)", "ceiling"),
    ("data wait fraction of step (0-1)", "data_wait"),
    ("GPU utilisation (%)", "gpu_util"),
    ("busy CPU cores", "busy_cores"),
    ("hypervisor steal (cores)", "steal_cores"),
    ("step (ms)", "step_ms"),
    ("loader settings (decode, workers, cores)", "loader_settings"),
]


def runs_table(result: VerifyResult, unit: str) -> Table:
    order = loaders_in(result)
    runs = sorted(result.runs, key=lambda r: (order.index(r.loader), r.gpus))
    return Table(
        title="One row per training run",
        rows=[_row(r) for r in runs],
        columns=[
            Shown(
                "loader",
                lambda r: r["loader"] + ("" if r["status"] == "ok" else f" ({r['status']})"),
                "left",
            ),
            Shown(unit_plural(unit), lambda r: str(r["gpus"])),
            Shown("images/s", lambda r: dash(r["images_per_s"], fmt_rate)),
            Shown("speedup", lambda r: dash(r["speedup"], lambda x: f"{x:.2f}×")),
            Shown("efficiency", lambda r: dash(r["efficiency"], lambda x: f"{x:.0%}")),
            Shown("of ceiling", lambda r: dash(r["ceiling"], lambda x: f"{x:.2f}")),
            Shown("data wait", lambda r: dash(r["data_wait"], lambda x: f"{x:.1%}")),
            Shown("step", lambda r: dash(r["step_ms"], lambda x: f"{x:,.1f} ms")),
            Shown("GPU util", lambda r: dash(r["gpu_util"], lambda x: f"{x:.0f}%")),
        ],
        csv=VERIFY_CSV,
        note="Efficiency: images/s ÷ (N × images/s at the fewest ranks); of ceiling: images/s ÷ "
        "the synthetic run's (data already on the device) at the same N; data wait: the "
        "share of each step spent waiting for the next batch.",
    )
