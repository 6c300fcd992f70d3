"""How warm a command starts (``attnjax bench warm RUN``): ``attnjax generate`` on one run,
greedy, twice, each time in a new process, both sharing a compilation cache that starts
empty (JAX's compiled executables and attnjax's kept programs, ``attnjax.programs``). Per
process: its wall time (interpreter start and imports included) and, from ``generate
--timings``, the seconds until the run is loaded and from there to its tokens (what the
caches can save: tracing, lowering and compiling the generation).

With ``python`` (an interpreter that has torch and transformers), the run is exported
(``attnjax export``) and transformers generates as many tokens from the same prompt, greedy,
in a new process each time, twice (``attnjax/bench/hf_generate.py``): the whole command's wall
time beside attnjax's, and whether the two printed the same text.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from attnjax.bench.common import write_json
from attnjax.pretrained.export import export_run

PROMPT, TOKENS, CALLS = "ROMEO:", 20, 2
HF_WORKER = Path(__file__).with_name("hf_generate.py")
TIMINGS = re.compile(r"timings: run checked and loaded in ([\d.]+) s, its tokens ([\d.]+) s")


def _timed(command: list[str], env: dict | None = None) -> tuple[float, str, str]:
    """``(wall seconds, stdout, stderr)`` of ``command``; a failure is one line."""
    start = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{' '.join(command[:4])} ... failed: {last}")
    return wall, done.stdout, done.stderr


def attnjax_rows(run: str, prompt: str, tokens: int, cache: Path,
                 calls: int = CALLS) -> list[dict]:
    """``calls`` processes of ``attnjax generate``, sharing ``cache`` (empty at first)."""
    env = {**os.environ, "ATTNJAX_COMPILE_CACHE": str(cache)}
    env.pop("JAX_COMPILATION_CACHE_DIR", None)        # this benchmark's cache, not another
    command = [sys.executable, "-m", "attnjax.cli", "generate", run, "--prompt", prompt,
               "--tokens", str(tokens), "--temperature", "0", "--timings"]
    rows = []
    for call in range(1, calls + 1):
        wall, out, err = _timed(command, env)
        loaded, generated = map(float, TIMINGS.search(err).groups())
        rows.append({"side": "attnjax", "call": call, "wall_s": wall, "loaded_s": loaded,
                     "to_tokens_s": generated, "text": out.rstrip("\n")})
    return rows


def transformers_rows(python: str, exported: Path, prompt: str, tokens: int) -> list[dict]:
    """``CALLS`` processes of transformers generating from ``exported`` (a run's export)."""
    command = [python, str(HF_WORKER), str(exported), prompt, str(tokens)]
    rows = []
    for call in range(1, CALLS + 1):
        wall, out, _ = _timed(command)
        rows.append({"side": "transformers", "call": call, "wall_s": wall,
                     "text": out.rstrip("\n")})
    return rows


def run_warm_benchmark(run: str, python: str | None = None, prompt: str = PROMPT,
                       tokens: int = TOKENS, out: str | None = None) -> list[dict]:
    """The module docstring's rows, printed as a table and written to ``out``."""
    with tempfile.TemporaryDirectory() as scratch:
        exported = Path(scratch) / "exported"
        if python is not None:        # a run no architecture expresses: refused before timing
            export_run(run, exported)
        rows = attnjax_rows(run, prompt, tokens, Path(scratch) / "cache")
        if python is not None:
            rows += transformers_rows(python, exported, prompt, tokens)
    same = len({r["text"] for r in rows}) == 1
    print(f"{run}: generate --prompt {prompt!r} --tokens {tokens}, greedy, each call a new "
          "process (one compilation cache, empty at first)")
    print(f"{'side':<14}{'call':>5}{'wall s':>9}{'run loaded s':>14}{'to tokens s':>13}")
    for r in rows:
        timings = (f"{r['loaded_s']:>14.3f}{r['to_tokens_s']:>13.3f}" if "loaded_s" in r
                   else f"{'':>14}{'':>13}")
        print(f"{r['side']:<14}{r['call']:>5}{r['wall_s']:>9.2f}{timings}")
    print("the same text from every call" if same else
          "the calls printed different texts:\n" + "\n".join(sorted({r["text"] for r in rows})))
    write_json(out, {"run": run, "prompt": prompt, "tokens": tokens, "same_text": same,
                     "rows": rows})
    return rows
