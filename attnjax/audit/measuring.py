"""Measuring the audit's claims: each claim's numbers from its trained runs (or from ops alone),
stored in ``results/<ID>.json`` with the fingerprint they belong to, so a rerun measures only
what changed.

Claims are measured side by side in single-core worker processes (``measure_claims``): most
measurements are compilations and small forward passes, which one core runs about as fast as
two. A claim whose criterion is about time (``TIMED = True`` in its file: it compares measured
seconds) is measured afterwards in this process, with the machine to itself.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import json
import multiprocessing
import os
import time
import traceback
from pathlib import Path

import numpy as np

from attnjax.audit.claims import ClaimFile, Runs, Trained, load_claim
from attnjax.compilation import enable_compile_cache
from attnjax.rundir import SweepDir, write_json_atomic
from attnjax.sweep.spec import Run
from attnjax.sweep.workers import core_shares
from attnjax.userfiles import read_json


def plain(value):
    """``value`` with NumPy / JAX scalars and arrays turned into Python numbers and lists."""
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if hasattr(value, "tolist"):
        return np.asarray(value).tolist()
    return value


def fingerprint(claim: ClaimFile, runs: list[Run]) -> str:
    text = claim.text + json.dumps(sorted(r.name for r in runs)) + claim.inputs()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stored(claim: ClaimFile, runs: list[Run], results_dir: Path) -> dict | None:
    """``{"results", "seconds"}`` stored for this claim file and these runs, else None."""
    path = results_dir / f"{claim.id}.json"
    if not path.is_file():
        return None
    record = read_json(path)
    return record if record["fingerprint"] == fingerprint(claim, runs) else None


def measured(claim: ClaimFile, runs: list[Run], sweep_dir: SweepDir,
             results_dir: Path) -> tuple[dict, float]:
    """The claim's results and the seconds their measurement took, from ``results_dir`` when
    they belong to this claim file and these runs, else measured now and stored."""
    record = stored(claim, runs, results_dir)
    if record is not None:
        return record["results"], record.get("seconds", 0.0)
    began = time.perf_counter()
    trained = Runs([Trained(run, sweep_dir.run(run.name)) for run in runs])
    results = plain(claim.measure(trained if claim.trains else None))
    seconds = time.perf_counter() - began
    results_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(results_dir / f"{claim.id}.json",
                      {"fingerprint": fingerprint(claim, runs), "seconds": seconds,
                       "results": results})
    return results, seconds


def failure_path(results_dir: Path, claim_id: str) -> Path:
    return results_dir / f"{claim_id}.error.txt"


def _measure_one(path: str, sweep_path: str, results_dir: str) -> str | None:
    """Worker task: measure the claim file at ``path`` and store its results; the error
    (``Type: message``, its traceback written beside the results) if it raised."""
    results_dir = Path(results_dir)
    try:
        claim = load_claim(path)
        measured(claim, claim.runs(), SweepDir(sweep_path), results_dir)
    except Exception as error:  # noqa: BLE001  (one claim's failure is reported, not fatal)
        results_dir.mkdir(parents=True, exist_ok=True)
        failure_path(results_dir, Path(path).stem).write_text(traceback.format_exc())
        return f"{type(error).__name__}: {error}"
    return None


def _pin(shares) -> None:
    os.sched_setaffinity(0, shares.get())
    enable_compile_cache()


def _previous_seconds(claim: ClaimFile, results_dir: Path) -> float:
    """Seconds the claim's last measurement took, whatever it belonged to (0 if none)."""
    path = results_dir / f"{claim.id}.json"
    return read_json(path).get("seconds", 0.0) if path.is_file() else 0.0


def measure_claims(claims: list[ClaimFile], own: dict[str, list[Run]], sweep_dir: SweepDir,
                   results_dir: Path, *, jobs: int | None = None, log=print,
                   workers=contextlib.nullcontext) -> dict[str, str]:
    """Measure every claim without stored results: untimed ones in ``jobs`` pinned worker
    processes (default: one per core; started inside the context ``workers()``), slowest last
    time first, then timed ones here, alone. Returns ``{claim id: error}`` for those whose
    measurement raised."""
    todo = [c for c in claims if stored(c, own[c.id], results_dir) is None]
    timed = [c for c in todo if getattr(c.module, "TIMED", False)]
    untimed = sorted((c for c in todo if c not in timed),
                     key=lambda c: -_previous_seconds(c, results_dir))
    errors, done = {}, 0

    def finished(claim_id: str, error: str | None, began: float):
        nonlocal done
        done += 1
        if error is not None:
            errors[claim_id] = error
        log(f"measured {done}/{len(todo)}: {claim_id}{' (error)' if error else ''} "
            f"({time.perf_counter() - began:.0f} s in)")

    if untimed:
        shares = core_shares(jobs or len(os.sched_getaffinity(0)))
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        for share in shares:
            queue.put(share)
        began = time.perf_counter()
        with workers(), concurrent.futures.ProcessPoolExecutor(
                len(shares), mp_context=context, initializer=_pin, initargs=(queue,)) as pool:
            futures = {pool.submit(_measure_one, str(c.path), str(sweep_dir.path),
                                   str(results_dir)): c.id for c in untimed}
            for future in concurrent.futures.as_completed(futures):
                finished(futures[future], future.result(), began)
    for claim in timed:
        began = time.perf_counter()
        finished(claim.id, _measure_one(str(claim.path), str(sweep_dir.path), str(results_dir)),
                 began)
    return errors
