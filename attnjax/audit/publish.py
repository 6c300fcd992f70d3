"""Publishing the audit (``attnjax audit --publish FILE.md``): the report ``FILE.md``, its
plots in ``<stem lowercased>/`` beside it, and there ``audit.json``, the published rows with
the invocations that measured them. An invocation replaces the rows of the claims it ran and
keeps every other claim's row as published before, so a new or changed claim is published
without measuring the others again; rows of claims no longer in the claims directory, their
plots and the invocations no row comes from any more are dropped."""

from __future__ import annotations

import shutil
from pathlib import Path

from attnjax.audit.report import audit_markdown
from attnjax.rundir import write_json_atomic
from attnjax.userfiles import read_json

RECORD = "audit.json"


def publish(rows: list[dict], path: str | Path, *, invocation: dict, order: list[str]) -> None:
    """Merge ``rows`` (each with ``claim_id``, the claim it is a part of, and ``plots``, paths)
    measured by ``invocation`` (see ``audit_markdown``) into the report at ``path``; ``order``:
    every claim id of the claims directory, in report order."""
    path = Path(path)
    images = path.parent / path.stem.lower()
    images.mkdir(parents=True, exist_ok=True)
    record_path = images / RECORD
    record = (read_json(record_path) if record_path.is_file()
              else {"invocations": [], "rows": []})
    for row in rows:
        for plot in row["plots"]:
            shutil.copyfile(plot, images / Path(plot).name)
    ran = {row["claim_id"] for row in rows}
    new = [{**row, "plots": [Path(p).name for p in row["plots"]],
            "invocation": len(record["invocations"])} for row in rows]
    kept = [row for row in record["rows"]
            if row["claim_id"] not in ran and row["claim_id"] in order]
    merged = sorted(kept + new, key=lambda row: order.index(row["claim_id"]))
    invocations = record["invocations"] + [invocation]
    used = sorted({row["invocation"] for row in merged})
    number = {old: new for new, old in enumerate(used)}
    merged = [{**row, "invocation": number[row["invocation"]]} for row in merged]
    plotted = {name for row in merged for name in row["plots"]}
    for stale in images.glob("*.png"):
        if stale.name not in plotted:
            stale.unlink()
    write_json_atomic(record_path, {"invocations": [invocations[i] for i in used],
                                    "rows": merged})
    path.write_text(audit_markdown(merged, invocations=[invocations[i] for i in used],
                                   plots_dir=images.name))
