"""``attnjax audit``: train every claim's runs once, measure each claim, judge it, report.

    WORKDIR/
      runs/               one sweep directory with every training run (a run two claims
                          share is trained once); resumable like any sweep
      results/<ID>.json   a claim's measured numbers and the fingerprint they belong to (the
                          claim file's text as loaded, and its runs): a rerun measures only
                          what changed (a change to attnjax itself is not seen: delete
                          results/<ID>.json to measure a claim again)
      plots/<ID>-*.png
      AUDIT.md            verdict counts, one row per claim, plots

A claim whose measurement raises is reported as ``error`` (with the exception) and the others
go on; the command then exits 1.
"""

from __future__ import annotations

import time
import traceback
from pathlib import Path

from attnjax.audit.claims import ClaimFile, load_claims
from attnjax.audit.measuring import failure_path, measure_claims, measured
from attnjax.audit.publish import publish
from attnjax.audit.report import audit_markdown
from attnjax.compilation import quick_compiling_workers
from attnjax.machine import describe
from attnjax.rundir import SweepDir, write_json_atomic
from attnjax.sweep.launch import launch_runs
from attnjax.sweep.spec import Run
from attnjax.userfiles import read_json


def collect_runs(claims: list[ClaimFile]) -> tuple[list[Run], dict[str, list[Run]]]:
    """Every claim's runs, each distinct run once, and each claim's own runs; two claims that
    name the same run with different configs are an error."""
    unique: dict[str, tuple[Run, str]] = {}
    own = {}
    for claim in claims:
        own[claim.id] = claim.runs()
        for run in own[claim.id]:
            if run.name in unique and unique[run.name][0].config != run.config:
                raise ValueError(f"claims {unique[run.name][1]} and {claim.id} both name run "
                                 f"{run.name!r} but configure it differently")
            unique.setdefault(run.name, (run, claim.id))
    return [run for run, _ in unique.values()], own


def spent_seconds(workdir: Path, phase: str, spent: float) -> float:
    """Wall seconds of the audit's ``phase`` (training, measuring), summed over every
    invocation (kept in ``workdir/seconds.json``), after adding this one's ``spent``."""
    path = workdir / "seconds.json"
    totals = read_json(path) if path.is_file() else {}
    totals[phase] = totals.get(phase, 0.0) + spent
    workdir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, totals)
    return totals[phase]


def run_audit(directory: str | Path, workdir: str | Path, *, only: list[str] | None = None,
              launcher: str = "vmap-processes", jobs: int | None = None, progress: bool = True,
              publish_to: str | Path | None = None, log=print) -> dict:
    """Run (or resume) the audit of the claim files under ``directory`` into ``workdir``
    (and, with ``publish_to``, publish its rows there: ``attnjax.audit.publish``); returns
    ``{"verdicts": {id: word}, "errors": {id: message}, "seconds": {"training", "measuring",
    "this invocation"}}``
    (training and measuring: the work itself, summed over the invocations that did it)."""
    start = time.perf_counter()
    workdir = Path(workdir)
    claims = load_claims(directory, only)
    runs, own = collect_runs(claims)
    sweep_dir = SweepDir(workdir / "runs")
    began = time.perf_counter()
    if runs:
        log(f"training {len(runs)} runs for {sum(c.trains for c in claims)} claims")
        with quick_compiling_workers():
            launch_runs(runs, sweep_dir.path, label=f"audit of {directory}",
                        launcher=launcher, jobs=jobs, progress=progress, log=log)
    seconds = {"training": spent_seconds(workdir, "training", time.perf_counter() - began)}
    began = time.perf_counter()
    results_dir = workdir / "results"
    failed = measure_claims(claims, own, sweep_dir, results_dir, jobs=jobs, log=log,
                            workers=quick_compiling_workers)
    seconds["measuring"] = spent_seconds(workdir, "measuring", time.perf_counter() - began)
    rows, verdicts, errors = [], {}, {}
    for number, claim in enumerate(claims, 1):
        began = time.perf_counter()
        base = {"claim_id": claim.id, "source": claim.module.SOURCE, "claim": claim.module.CLAIM,
                "criterion": claim.module.CRITERION, "plots": []}
        error = failed.get(claim.id)
        if error is None:
            try:
                results, _ = measured(claim, own[claim.id], sweep_dir, results_dir)
                parts = claim.verdicts(results)
                plots = claim.plot(results, workdir / "plots")
            except Exception as raised:  # noqa: BLE001  (one claim's failure is reported)
                error = f"{type(raised).__name__}: {raised}"
                failure_path(results_dir, claim.id).write_text(traceback.format_exc())
        if error is not None:
            errors[claim.id] = error
            rows.append({**base, "id": claim.id, "evidence": error, "verdict": "error"})
            log(f"[{number}/{len(claims)}] {claim.id}: error: {error}")
            continue
        for i, (part, verdict) in enumerate(parts.items()):
            verdicts[part] = verdict.word
            rows.append({**base, "id": part, "evidence": verdict.evidence,
                         "verdict": verdict.word, "plots": plots if i == 0 else []})
        words = ", ".join(f"{part} {v.word}" for part, v in parts.items())
        log(f"[{number}/{len(claims)}] {words} ({time.perf_counter() - began:.1f} s)")
    seconds["this invocation"] = time.perf_counter() - start
    invocation = {"machine": describe(), "claims": list(only) if only else "all",
                  "seconds": seconds}
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "AUDIT.md").write_text(audit_markdown(rows, invocations=[invocation],
                                                     plots_dir="plots"))
    if publish_to is not None:
        publish(rows, publish_to, invocation=invocation,
                order=[claim.id for claim in load_claims(directory)])
    log(f"wrote {workdir / 'AUDIT.md'} ({len(verdicts)} verdicts, {len(errors)} errors, "
        f"{seconds['this invocation'] / 60:.1f} min)")
    return {"verdicts": verdicts, "errors": errors, "seconds": seconds}
