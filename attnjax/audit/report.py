"""AUDIT.md: the verdict counts, then one row per claim (or lettered part), then the plots."""

from __future__ import annotations

import collections
from pathlib import Path

from attnjax.audit.verdict import WORDS

COMMAND = "attnjax audit experiments/claims --workdir runs/claims"

CONVENTIONS = (
    "Each claim of the two seed articles is an experiment (`experiments/claims/<group>/<ID>.py`) "
    "whose verdict function applies a criterion fixed before any result to the numbers this "
    "audit measured. **confirmed**: the criterion holds at the scale run here; **refuted**: it "
    "fails; **scale-dependent**: it holds in some of the regimes run and fails in others; "
    "**untestable**: it needs what this machine cannot give (said why). Training claims run "
    "every arm at seeds 0 and 1 and must hold for both; seeds that disagree refute, and the "
    "split is reported. Loss is the validation loss at the training length in nats per byte "
    "(per token on synthetic tasks); eps = 0.02 nats. The small settings (S-text: byte-level "
    "text, width 64, 2 layers, 4 heads, RoPE, context 64, 600 steps; S-s2s: an encoder-decoder "
    "of 2 + 2 layers reversing 8-32 tokens, 2000 steps) are in `attnjax/audit/settings.py`; "
    "the pretrained ones (P-MiniLM: the real all-MiniLM-L6-v2, installed by `make minilm`, on "
    "sentences of the standard library's docstrings; P-SmolLM: the real SmolLM2-135M-Instruct "
    "decoder, installed by `make smollm`, on windows of those docstrings) in "
    "`attnjax/audit/pretrained.py` and `attnjax/audit/smollm.py`.")


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _ran(invocation: dict) -> str:
    """One line: where an invocation ran, which claims, and its work in minutes."""
    seconds, claims = invocation["seconds"], invocation["claims"]
    work = seconds["training"] + seconds["measuring"]
    which = "every claim" if claims == "all" else "claims " + ", ".join(claims)
    return (f"Ran on {invocation['machine']}, {which}: training {seconds['training'] / 60:.1f} "
            f"min + measuring {seconds['measuring'] / 60:.1f} min = {work / 60:.1f} min of work "
            f"(the invocation itself: {seconds['this invocation'] / 60:.1f} min).")


def audit_markdown(rows: list[dict], *, invocations: list[dict], plots_dir: str) -> str:
    """The report. ``rows``: ``{"id", "source", "claim", "criterion", "evidence", "verdict",
    "plots"}`` (``verdict`` ``"error"`` for a claim whose measurement raised);
    ``invocations``: the audits that measured them, each ``{"machine", "claims"`` (ids, or
    ``"all"``), ``"seconds": {"training", "measuring"`` (the work, over every invocation of
    its work directory), ``"this invocation"}}``."""
    counts = collections.Counter(row["verdict"] for row in rows)
    lines = ["# Claims audit", "", "Regenerate with (`--only ID,ID` to measure some claims "
             "again; `--publish docs/CLAIMS_AUDIT.md` then replaces only their rows here):", "",
             f"    {COMMAND}", ""]
    lines += [f"- {_ran(invocation)}" for invocation in invocations]
    lines += ["", CONVENTIONS, "", "| verdict | claims |", "|---|---|"]
    lines += [f"| {word} | {counts[word]} |" for word in (*WORDS, "error") if counts[word]]
    lines += ["", "| id | source | claim | criterion | measured | verdict |",
              "|---|---|---|---|---|---|"]
    previous = None
    for row in rows:    # a claim's later parts leave its source, claim and criterion blank
        same = previous is not None and (row["claim"], row["source"]) == previous
        text = ("", "", "") if same else (row["source"], row["claim"], row["criterion"])
        lines.append(f"| {row['id']} | {' | '.join(map(_cell, text))} | "
                     f"{_cell(row['evidence'])} | **{row['verdict']}** |")
        previous = (row["claim"], row["source"])
    plotted = [row for row in rows if row["plots"]]
    if plotted:
        lines += ["", "## Plots"]
        for row in plotted:
            lines += ["", f"### {row['id']}: {row['claim']}", ""]
            lines += [f"![{row['id']}]({plots_dir}/{Path(p).name})" for p in row["plots"]]
    return "\n".join(lines) + "\n"
