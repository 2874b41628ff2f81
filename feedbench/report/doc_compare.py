"""A comparison as a :class:`~feedbench.report.doc.Document`: the winner first, one row per
system (accelerators fed, MB/s, files/s, read p99, cost per accelerator fed, validity), the
throughput at every consumer count, each system under test, and what differs between the runs."""

from __future__ import annotations

from pathlib import Path

from feedbench.report.compare import Column, Comparison, question
from feedbench.report.doc import Document, Row, Shown, SystemBlock, Table, command_text, dash
from feedbench.report.fmt import fed_text, fmt_bytes, fmt_pct, fmt_rate, fmt_s, supported_text
from feedbench.scan.results import NOT_VALID

PROJECTED = (
    "Each scan's {pass_name} pass fitted and projected by the code feedbench plan runs, with its "
    "defaults (docs/plan.md): the chosen model's rate with its 95% band, the held-out check."
)


def compare_document(cmp: Comparison, source: str) -> Document:
    rows = [c for c in cmp.columns if c.system is not None]
    judged = [c for c in rows if c.system.valid_for_sizing is not None]
    valid = all(c.system.valid_for_sizing for c in judged) if judged else None
    return Document(
        kind="compare",
        title=f"{question(cmp.columns)} {' vs '.join(c.label for c in cmp.columns)}",
        subtitle=f"feedbench compare · {Path(source).name} · {cmp.pass_name} pass · "
        f"{cmp.created_utc}",
        answer=answer(cmp),
        valid=valid,
        broken=[
            f"{c.label}: " + "; ".join(c.system.not_valid_because)
            for c in judged
            if c.system.not_valid_because
        ],
        summary=systems_table(cmp.columns),
        tables=[throughput_table(cmp), setups_table(cmp.columns)],
        systems=[_block(c) for c in cmp.columns],
        method=[
            ("pass compared", cmp.pass_name),
            (
                "consumer counts",
                ", ".join(map(str, cmp.counts))
                + f" (measured by every file: {', '.join(map(str, cmp.common_counts)) or 'none'})",
            ),
            ("files", "; ".join(f"{c.label}: {c.path}" for c in cmp.columns)),
            (
                "a real difference",
                "a gap larger than twice the two measurements' combined "
                "standard deviation (over their repeats)",
            ),
        ],
        projection=[f"{c.label}: {c.projection}" for c in cmp.columns if c.projection],
        projection_note=PROJECTED.format(pass_name=cmp.pass_name),
        findings=[r.text for r in cmp.rankings]
        + list(cmp.summary)
        + [f"{c.label}: {c.verdict}" for c in cmp.columns if c.verdict],
        # each system's broken sizing rules are in the answer already
        warnings=[
            w
            for w in cmp.warnings
            if not any(w.startswith(f"{c.label}: {NOT_VALID}") for c in cmp.columns)
        ],
        command=command_text(cmp.command),
        created_utc=cmp.created_utc,
        tool_version=cmp.tool_version,
    )


def answer(cmp: Comparison) -> list[str]:
    """The answer to the page's question: the winner (by accelerators fed or their cost), else
    the samples/s ranking at the most consumers every file measured, else the first summary."""
    if cmp.winner:
        lines = [cmp.winner]
    elif cmp.rankings:
        lines = [cmp.rankings[-1].text]
    else:
        lines = list(cmp.summary[:1])
    for c in cmp.columns:
        r = c.system
        if r is not None and r.accelerators_fed is not None:
            lines.append(f"{c.label}: feeds {fed_text(r.accelerators_fed, r.accelerators_fed_std)}"
                         f" accelerators ({c.accelerator}) at AU ≥ {fmt_pct(r.target_au)}"
                         + (f", ${r.usd_per_accelerator_fed:,.0f} per accelerator fed"
                            if r.usd_per_accelerator_fed else "") + ".")  # fmt: skip
    return lines


def _row(c: Column) -> Row:
    r = c.system
    return {
        "system": c.label, "accelerator": c.accelerator, "fed": r.accelerators_fed,
        "fed_std": r.accelerators_fed_std, "target_au": r.target_au, "consumers": r.consumers,
        "samples_per_s": r.samples_per_s, "mb_per_s": r.mb_per_s, "files_per_s": r.files_per_s,
        "read_p99_ms": r.read_p99_ms, "clients": r.clients, "cost_usd": r.cost_usd,
        "supported": c.supported_consumers, "supported_at_least": c.supported_at_least,
        "supported_lower_bound": _yes_no(c.supported_at_least)
        if c.supported_consumers is not None or c.supported_at_least else None,
        "usd_per_fed": r.usd_per_accelerator_fed,
        "valid": None if r.valid_for_sizing is None else ("yes" if r.valid_for_sizing else "no"),
        "not_valid_because": "; ".join(r.not_valid_because),
    }  # fmt: skip


def _yes_no(x: bool) -> str:
    return "yes" if x else "no"


COMPARE_CSV = [
    ("system", "system"),
    ("accelerator", "accelerator"),
    ("accelerators fed at target AU", "fed"),
    ("accelerators fed std", "fed_std"),
    ("target AU (0-1)", "target_au"),
    ("at consumers", "consumers"),
    ("supported consumers (AU ≥ target)", "supported"),
    # find-max stopped at a count it could not decide: the figure is "at least"
    ("supported consumers is a lower bound", "supported_lower_bound"),
    ("samples/s mean", "samples_per_s"),
    ("MB/s mean (1 MB = 10^6 B)", "mb_per_s"),
    ("files/s mean", "files_per_s"),
    ("read p99 latency (ms)", "read_p99_ms"),
    ("clients", "clients"),
    ("cost (USD)", "cost_usd"),
    ("cost per accelerator fed (USD)", "usd_per_fed"),
    ("valid for sizing", "valid"),
    ("not valid because", "not_valid_because"),
]


def _sizing_cell(r: Row) -> str:
    if r["valid"] is None:
        return "not assessed"
    return "valid" if r["valid"] == "yes" else NOT_VALID


def systems_table(cols: list[Column]) -> Table:
    rows = [_row(c) for c in cols if c.system is not None]
    columns = [
        Shown("system", lambda r: r["system"], "left"),
        Shown("accelerators fed", lambda r: fed_text(r["fed"], r["fed_std"])),
        Shown("at N", lambda r: dash(r["consumers"])),
    ]
    if any(r["supported"] is not None or r["supported_at_least"] for r in rows):
        columns.append(
            Shown(
                "supported consumers",
                lambda r: supported_text(r["supported"], r["supported_at_least"]),
            )
        )
    columns += [
        Shown("samples/s", lambda r: dash(r["samples_per_s"], fmt_rate)),
        Shown("MB/s", lambda r: dash(r["mb_per_s"], lambda x: f"{x:,.1f}")),
        Shown("files/s", lambda r: dash(r["files_per_s"], fmt_rate)),
        Shown("read p99", lambda r: dash(r["read_p99_ms"], lambda x: fmt_s(x / 1e3))),
        Shown("clients", lambda r: str(r["clients"])),
    ]
    if any(r["cost_usd"] for r in rows):
        columns += [Shown("cost", lambda r: dash(r["cost_usd"], lambda x: f"${x:,.0f}")),
                    Shown("cost per accelerator fed",
                          lambda r: dash(r["usd_per_fed"], lambda x: f"${x:,.0f}"))]  # fmt: skip
    columns.append(Shown("sizing", _sizing_cell, "left"))
    return Table(
        title="One row per system",
        rows=rows,
        columns=columns,
        csv=COMPARE_CSV,
        note="Each system at its reference point: the consumer count that fed the most "
        "accelerators (else its fastest); MB/s, files/s and read p99 from that same window.",
    )


def throughput_table(cmp: Comparison) -> Table:
    def cell(c: Column):
        def text(r: Row) -> str:
            p = c.points.get(r["consumers"])
            if p is None:
                return "not measured"
            spread = f" ± {fmt_rate(p.samples_per_s_std)}" if p.repeats > 1 else ""
            return f"{fmt_rate(p.samples_per_s_mean)}{spread} ({p.mb_per_s_mean:,.1f} MB/s)"

        return text

    return Table(
        title="Throughput by consumer count (samples/s mean ± std, and MB/s)",
        rows=[{"consumers": n} for n in cmp.counts],
        columns=[Shown("consumers", lambda r: str(r["consumers"]))]
        + [Shown(c.label, cell(c)) for c in cmp.columns],
    )


def setups_table(cols: list[Column]) -> Table:
    """What each scan measured: one row per aspect, one column per system."""
    aspects = [
        (
            "data",
            lambda c: (
                f"{c.dataset_format}: {c.dataset_files:,} files, {fmt_bytes(c.dataset_bytes)}"
            ),
        ),
        ("path", lambda c: c.dataset),
        ("stages", lambda c: ",".join(c.stages)),
        ("batch / image", lambda c: f"{c.batch_size} / {c.image_size}"),
        ("cache", lambda c: c.cache),
        ("accelerator", lambda c: c.accelerator or "none"),
        (
            "scanned",
            lambda c: c.created_utc[:16].replace("T", " ") + (" (partial)" if c.partial else ""),
        ),
    ]
    rows = [{"aspect": name, **{c.label: get(c) for c in cols}} for name, get in aspects]
    return Table(
        title="Setups: what each scan measured",
        rows=rows,
        columns=[Shown("", lambda r: r["aspect"], "left")]
        + [Shown(c.label, lambda r, k=c.label: str(r[k]), "left") for c in cols],
    )


def _block(c: Column) -> SystemBlock:
    facts = [(str(k), str(v)) for k, v in c.system_facts]
    if not facts:  # a comparison from before the facts were kept
        facts = [("host", c.host), ("storage", c.storage or "—"), ("CPUs", str(c.cpus))]
        if c.described:
            facts.insert(0, ("described as", c.described))
    flags = list(c.system_flags)
    if "slowed" in c.cache and not flags:
        flags.append(f"Slowed on purpose: {c.cache}")
    return SystemBlock(c.label, facts, flags)
