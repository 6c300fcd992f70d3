"""The claims audit: every claim file is well formed, its verdict function gives the expected
word on made-up results on both sides of its criterion, its training runs expand to valid,
seed-replicated configs, and the op-level claims run here; the audit runner trains shared
runs once, resumes from stored results and reports errors without stopping."""

import json
import textwrap

import pytest

from attnjax.audit import Verdict, load_claim, load_claims, over_regimes, over_seeds
from attnjax.audit.publish import publish
from attnjax.audit.runner import collect_runs, run_audit
from attnjax.audit.settings import SEEDS
from attnjax.audit.timing import blocked_medians, spread
from attnjax.audit.verdict import WORDS
from attnjax.sweep.launch import vmap_groups
from helpers import REPO, TINY_TEXT

CLAIMS_DIR = REPO / "experiments" / "claims"
CLAIMS = load_claims(CLAIMS_DIR)
OP_LEVEL = [c for c in CLAIMS if not c.trains]
TRAINING = [c for c in CLAIMS if c.trains]
ids = lambda claim: claim.id


def _words(claim, expected) -> dict:
    return {claim.id: expected} if isinstance(expected, str) else {
        f"{claim.id}{part}": word for part, word in expected.items()}


@pytest.mark.parametrize("claim", CLAIMS, ids=ids)
def test_claim_file_is_well_formed(claim):
    module = claim.module
    assert module.__doc__ and f"--only {claim.id}" in module.__doc__
    for name in ("SOURCE", "CLAIM", "CRITERION"):
        text = getattr(module, name)
        assert isinstance(text, str) and text and "\n" not in text, (claim.id, name)
    assert claim.group[0] in "ABCDEFGH" and claim.path.parent.parent == CLAIMS_DIR


@pytest.mark.parametrize("claim", CLAIMS, ids=ids)
def test_verdict_on_both_sides_of_the_criterion(claim):
    """Every part's verdict is tested with results that confirm and with results that refute
    it (or, for a part that can only be scale-dependent or untestable, with each word it
    gives)."""
    seen: dict[str, set] = {}
    for results, expected in claim.module.EXAMPLES:
        verdicts = claim.verdicts(results)
        got = {part: v.word for part, v in verdicts.items()}
        assert got == _words(claim, expected), (claim.id, results)
        assert all(isinstance(v, Verdict) and v.evidence for v in verdicts.values())
        for part, word in got.items():
            seen.setdefault(part, set()).add(word)
    for part, words in seen.items():
        assert len(words) >= 2, f"{part}: examples give only {words}"


@pytest.mark.parametrize("claim", TRAINING, ids=ids)
def test_training_claim_expands_to_seeded_arms_that_share_a_vmapped_program(claim):
    runs = claim.runs()
    assert runs and len({r.name for r in runs}) == len(runs)
    arms: dict = {}
    for run in runs:
        rest = tuple(sorted((k, repr(v)) for k, v in run.overrides.items() if k != "seed"))
        arms.setdefault(rest, set()).add(run.config.seed)
    for arm, seeds in arms.items():
        assert set(SEEDS) <= seeds, f"{claim.id}: arm {arm} runs seeds {sorted(seeds)}"
    groups = [{r.name for r in g} for g in vmap_groups(runs)]
    for arm in arms:
        names = {r.name for r in runs if tuple(sorted(
            (k, repr(v)) for k, v in r.overrides.items() if k != "seed")) == arm}
        assert any(names <= g for g in groups), f"{claim.id}: seeds of {arm} split"


def test_shared_runs_are_configured_identically_across_claims():
    runs, own = collect_runs(TRAINING)          # raises if two claims disagree on a run
    assert len(runs) <= sum(len(r) for r in own.values())


@pytest.mark.parametrize("claim", CLAIMS, ids=ids)
def test_claims_that_time_are_measured_alone(claim):
    """A claim whose measurement reads a clock is ``TIMED``, so the audit measures it with the
    machine to itself rather than beside another claim's worker."""
    times = any(word in claim.text for word in ("perf_counter", "timing", "timeit"))
    assert getattr(claim.module, "TIMED", False) == times


@pytest.mark.parametrize("claim", OP_LEVEL, ids=ids)
def test_op_level_claim_measures_and_judges(claim, monkeypatch):
    """Each op-level measurement runs and its verdict judges the results; a claim's
    ``TEST_SIZE`` (module attributes -> values) runs the same code on less (fewer lengths,
    regimes or timing rounds) here, the audit at full size."""
    for name, value in getattr(claim.module, "TEST_SIZE", {}).items():
        assert hasattr(claim.module, name), f"{claim.id}: TEST_SIZE names no attribute {name}"
        monkeypatch.setattr(claim.module, name, value)
    results = claim.measure()
    json.dumps(results)                          # results are stored as JSON
    verdicts = claim.verdicts(results)
    assert verdicts and all(v.word in WORDS for v in verdicts.values())


def test_over_seeds_and_regimes():
    assert over_seeds({0: True, 1: True}) == (True, "")
    ok, note = over_seeds({0: True, 1: False})
    assert not ok and "seed [0]" in note and "seed [1]" in note
    assert over_regimes({"a": True, "b": True}, "x").word == "confirmed"
    assert over_regimes({"a": False, "b": {0: False, 1: False}}, "x").word == "refuted"
    mixed = over_regimes({"a": True, "b": {0: True, 1: False}}, "x")
    assert mixed.word == "scale-dependent" and "fails in b" in mixed.evidence
    assert "seeds disagree" in mixed.evidence
    with pytest.raises(ValueError, match="verdict word"):
        Verdict("maybe", "x")


def test_blocked_timing_pools_every_call_and_shows_each_block():
    calls = {"one": lambda: 1, "two": lambda: 2}
    pooled, blocks = blocked_medians(calls, 3, repeats=4, most=4)
    assert len(blocks) == 3 and all(set(b) == set(calls) for b in blocks)
    for name in calls:     # the median of all calls lies within the blocks' medians
        assert min(b[name] for b in blocks) <= pooled[name] <= max(b[name] for b in blocks)
    assert spread([1.0, 1.2], 1.5) == "blocks x1.00, x1.20"
    assert spread([1.4, 1.6], 1.5).endswith(
        "x1.5 is inside their spread, the verdict moves with the machine's load")


TINY_CLAIM = '''
"""XX1: a tiny training claim for the runner test.

    attnjax audit DIR --only XX1
"""
from attnjax.audit import holds
from attnjax.audit.settings import with_seeds
from attnjax.config import Config, apply_overrides

ID, SOURCE, CLAIM, CRITERION = "XX1", "test", "tiny runs train", "loss is finite"
EXAMPLES = []
CALLS = []


def get_config():
    return apply_overrides(Config(), OVERRIDES)


def get_sweep():
    return with_seeds([{}, {"train.learning_rate": 0.01}])


def measure(runs):
    return {t.run.name: t.loss() for t in runs.all}


def verdict(results):
    return holds(all(v == v for v in results.values()), str(len(results)) + " runs")
'''


def _claims_dir(tmp_path, *, broken: bool = False):
    group = tmp_path / "claims" / "A_test"
    group.mkdir(parents=True)
    (group / "XX1.py").write_text(TINY_CLAIM.replace("OVERRIDES", repr(TINY_TEXT)))
    (group / "XX2.py").write_text(textwrap.dedent(f'''
        """XX2: an op-level claim. --only XX2"""
        from attnjax.audit import holds
        ID, SOURCE, CLAIM, CRITERION = "XX2", "test", "one is one", "1 == 1"
        EXAMPLES = []

        def measure():
            {"raise RuntimeError('planted')" if broken else "return {'one': 1}"}

        def verdict(results):
            return {{"a": holds(results["one"] == 1, "1"), "b": holds(False, "0")}}

        def plot(results, out_dir):
            from attnjax.analysis.figures import subplots
            fig, ax = subplots(figsize=(4, 4))
            ax.plot([0, 1, 2], [0, 1, 4])
            fig.savefig(out_dir / "XX2-curve.png")
            return [out_dir / "XX2-curve.png"]
        '''))
    return tmp_path / "claims"


def test_audit_trains_measures_caches_and_reports(tmp_path):
    directory, work = _claims_dir(tmp_path), tmp_path / "work"
    logs = []
    docs = tmp_path / "docs" / "CLAIMS_AUDIT.md"
    docs.parent.mkdir()
    first = run_audit(directory, work, launcher="vmap", progress=False, publish_to=docs,
                      log=logs.append)
    assert first["verdicts"] == {"XX1": "confirmed", "XX2a": "confirmed", "XX2b": "refuted"}
    assert not first["errors"]
    report = (work / "AUDIT.md").read_text()
    assert "| confirmed | 2 |" in report and "| refuted | 1 |" in report
    assert "| XX2a | test | one is one | 1 == 1 | 1 | **confirmed** |" in report
    assert "| XX2b |  |  |  | 0 | **refuted** |" in report
    assert "attnjax audit experiments/claims --workdir runs/claims" in report
    assert "![XX2a](plots/XX2-curve.png)" in report
    assert "![XX2a](claims_audit/XX2-curve.png)" in docs.read_text()
    assert (docs.parent / "claims_audit" / "XX2-curve.png").is_file()
    stored = json.loads((work / "results" / "XX1.json").read_text())["results"]
    assert len(stored) == 4 and all(isinstance(v, float) for v in stored.values())
    assert any("[1/2] XX1 confirmed" in line for line in logs)
    # a rerun trains nothing and reads the stored results
    logs.clear()
    again = run_audit(directory, work, launcher="vmap", progress=False, log=logs.append)
    assert again["verdicts"] == first["verdicts"]
    # the work's time is the first invocation's (plus the rerun's no-op launch and lookup)
    assert 0 < first["seconds"]["measuring"] <= again["seconds"]["measuring"]
    assert again["seconds"]["measuring"] < first["seconds"]["measuring"] + 1.0
    assert first["seconds"]["training"] <= again["seconds"]["training"]
    assert again["seconds"]["this invocation"] < first["seconds"]["this invocation"]
    assert "min of work" in report
    assert any("4 finished, 0 to run" in line for line in logs)
    # --only, and a claim whose measurement raises is an error row, not a crash
    only = run_audit(_claims_dir(tmp_path / "b", broken=True), tmp_path / "work-b",
                     only=["XX2"], launcher="vmap", progress=False, log=logs.append)
    assert only["errors"] == {"XX2": "RuntimeError: planted"} and not only["verdicts"]
    assert "| error | 1 |" in (tmp_path / "work-b" / "AUDIT.md").read_text()


def _rows(claim_id, verdict, plot=None):
    return [{"claim_id": claim_id, "id": f"{claim_id}{part}", "source": "s", "claim": claim_id,
             "criterion": "c", "evidence": f"{verdict} {part}", "verdict": verdict,
             "plots": [plot] if plot and part == "a" else []} for part in "ab"]


def test_publishing_replaces_the_rows_of_the_claims_it_ran_and_keeps_the_others(tmp_path):
    docs = tmp_path / "docs" / "AUDIT.md"
    images = docs.parent / "audit"
    for name in ("XX1-old.png", "XX1-new.png"):
        (tmp_path / name).write_bytes(b"png")
    invocation = lambda claims: {"machine": "here", "claims": claims, "seconds": {
        "training": 60.0, "measuring": 30.0, "this invocation": 90.0}}
    order = ["XX1", "XX2", "XX3"]
    publish(_rows("XX1", "refuted", tmp_path / "XX1-old.png") + _rows("XX2", "confirmed")
            + _rows("XX3", "refuted"), docs, invocation=invocation("all"), order=order)
    publish(_rows("XX1", "confirmed", tmp_path / "XX1-new.png"), docs,
            invocation=invocation(["XX1"]), order=order[:2])       # XX3's claim file is gone
    text = docs.read_text()
    rows = [line for line in text.splitlines() if line.startswith("| XX")]
    assert [row.split(" | ")[0] for row in rows] == ["| XX1a", "| XX1b", "| XX2a", "| XX2b"]
    assert "**confirmed**" in rows[0] and "confirmed a" in rows[0] and "confirmed b" in rows[3]
    assert "| confirmed | 4 |" in text and "| refuted |" not in text
    assert "Ran on here, every claim:" in text and "Ran on here, claims XX1:" in text
    assert sorted(p.name for p in images.glob("*.png")) == ["XX1-new.png"]
    assert "![XX1a](audit/XX1-new.png)" in text
    # measuring every remaining claim again leaves one invocation behind the rows
    publish(_rows("XX1", "confirmed") + _rows("XX2", "confirmed"), docs,
            invocation=invocation("all"), order=order[:2])
    record = json.loads((images / "audit.json").read_text())
    assert len(record["invocations"]) == 1 and docs.read_text().count("Ran on") == 1


def test_unknown_claim_id_lists_the_valid_ones(tmp_path):
    with pytest.raises(ValueError, match="--only: no claim 'NOPE'; valid: XX1, XX2"):
        load_claims(_claims_dir(tmp_path), only=["NOPE"])


def test_claim_file_named_after_its_id(tmp_path):
    path = tmp_path / "A" / "SC99.py"
    path.parent.mkdir()
    path.write_text("ID, SOURCE, CLAIM, CRITERION, EXAMPLES = 'SC98', '', '', '', []\n"
                    "measure = verdict = None\n")
    with pytest.raises(ValueError, match="name it SC98.py"):
        load_claim(path)
