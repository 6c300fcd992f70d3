"""Verdicts of the claims audit: one word per claim, or per lettered part, with its evidence.

- ``confirmed``: the criterion holds at the scale run here;
- ``refuted``: it fails;
- ``scale-dependent``: it holds in some of the regimes the audit ran and fails in the others;
- ``untestable``: it needs what this machine cannot give, or its premise never occurs in the
  runs ("not reached here").

A training criterion must hold for every seed: seeds that disagree refute, and the evidence
reports the split (docs/CLAIMS_AUDIT.md conventions, from ../shared/design/CLAIMS.md).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

WORDS = ("confirmed", "refuted", "scale-dependent", "untestable")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A verdict word and the measured numbers behind it, in one line."""
    word: str
    evidence: str

    def __post_init__(self):
        if self.word not in WORDS:
            raise ValueError(f"verdict word {self.word!r} is not one of {', '.join(WORDS)}")


def holds(condition: bool, evidence: str) -> Verdict:
    """``confirmed`` if ``condition`` else ``refuted``."""
    return Verdict("confirmed" if condition else "refuted", evidence)


def untestable(reason: str) -> Verdict:
    return Verdict("untestable", reason)


def over_seeds(holding: Mapping[int, bool]) -> tuple[bool, str]:
    """Whether a criterion holds for every seed, and a note naming the split when the seeds
    disagree (empty otherwise)."""
    yes = sorted(seed for seed, ok in holding.items() if ok)
    no = sorted(seed for seed, ok in holding.items() if not ok)
    note = f"seeds disagree: holds for seed {yes}, fails for seed {no}" if yes and no else ""
    return not no, note


def over_regimes(holding: Mapping[str, bool | Mapping[int, bool]], evidence: str) -> Verdict:
    """The verdict of a criterion applied in each regime (a regime's value is a bool, or a
    ``{seed: bool}`` map that must hold for every seed): ``confirmed`` if it holds in all,
    ``refuted`` in none, else ``scale-dependent``; the evidence names where it failed."""
    verdicts, notes = {}, []
    for regime, value in holding.items():
        if isinstance(value, Mapping):
            value, note = over_seeds(value)
            if note:
                notes.append(f"{regime}: {note}" if len(holding) > 1 else note)
        verdicts[regime] = bool(value)
    if all(verdicts.values()):
        word = "confirmed"
    elif not any(verdicts.values()):
        word = "refuted"
    else:
        word = "scale-dependent"
        notes.append("holds in " + ", ".join(r for r, ok in verdicts.items() if ok)
                     + "; fails in " + ", ".join(r for r, ok in verdicts.items() if not ok))
    return Verdict(word, "; ".join([evidence] + notes))
