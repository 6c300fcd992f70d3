"""The attention explorer (``attnjax.analysis.explore``, ``attnjax explore``), opened in
headless Chromium (Debian's ``chromium``, driven by playwright; the browser tests are skipped,
naming the install command, only where neither can be had): the page loads with no console
error and no request but for its own file; the weights it shows for a layer, head and query
are the run's (read back from the page); hovering a map, a token or a cell and the keyboard do
what the page says; the table sorts; and each family renders: a decoder imported with its
tokenizer (through the command line, with ``attnjax patch`` and ``attnjax heads`` tables in its
run directory), a padded encoder batch, and an encoder–decoder's three head groups. One
browser for the file, tiny models."""

from __future__ import annotations

import argparse
import base64
import contextlib
import html
import io
import json
import shutil

import numpy as np
import pytest

from attnjax.analysis.capture import (attention_weights, model_arguments, probe_examples,
                                      stream_attention)
from attnjax.analysis.diagnostics import head_statistics
from attnjax.analysis.explore import explorer_data, read_result_tables, render_page
from attnjax.analysis.heatmaps import token_labels
from attnjax.cli import main
from attnjax.cli.analysis import explore_command
from attnjax.pretrained.run import import_run
from attnjax.rundir import RunDir
from attnjax.train.state import init_params
from helpers import REPO, TINY_MLM, TINY_SEQ2SEQ, raises_one_line, run_cli, tiny_config

INSTALL = "apt-get install -y chromium && .venv/bin/pip install -e '.[dev]'"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]
TEXT = "The cat sat on the mat. The cat sat on"
LAYERS, HEADS = 2, 4                     # tests/data/hf/gpt2


def result_files(run, shape) -> dict:
    """``RUN/patch/patching.md`` and ``RUN/heads/knockout.md`` as ``attnjax patch`` and
    ``attnjax heads`` write their per-head tables (header, rule, ``| L<l>.H<h> |`` rows),
    with known values; returns them by column."""
    L, N = shape
    recovered = np.arange(L * N).reshape(L, N) / 10 - 0.2
    delta = np.arange(L * N).reshape(L, N) / 100
    heads = [(l, h) for l in range(L) for h in range(N)]
    (run / "patch").mkdir()
    (run / "patch" / "patching.md").write_text("\n".join(
        ["# Patching: gpt2 step 0", "", "On the texts.", "",
         "| head | recovered by its clean output | lost by its corrupted output |",
         "|---|---|---|", *(f"| L{l}.H{h} | {recovered[l, h]:+.3f} | {-recovered[l, h]:+.3f} |"
                            for l, h in heads), ""]))
    (run / "heads").mkdir()
    (run / "heads" / "knockout.md").write_text("\n".join(
        ["# Heads of gpt2 step 0", "", "| head | knockout delta loss | importance "
         "(layer-normalised) |", "|---|---|---|",
         *(f"| L{l}.H{h} | {delta[l, h]:+.4f} | — |" for l, h in heads), "",
         "| fraction removed | knockout loss / acc |", "|---|---|", "| 0.000 | 1.0 / 0.5 |",
         "", "| layer | mean pairwise JS (nats) | closest pair | its JS |", "|---|---|---|---|",
         "| L0 | 0.1 | H0–H1 | 0.05 |", ""]))
    return {"recovered by its clean output": recovered, "knockout delta loss": delta}


@pytest.fixture(scope="module")
def decoder(tmp_path_factory):
    """tests/data/hf/gpt2 imported (its tokenizer's pieces), with patching and knockout tables
    in its run directory, explored through the command line on ``TEXT``."""
    root = tmp_path_factory.mktemp("explore")
    run = root / "gpt2"
    import_run(REPO / "tests" / "data" / "hf" / "gpt2", run)
    written = result_files(run, (LAYERS, HEADS))
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explore", str(run), "--text", TEXT, "--out", str(root / "gpt2.html")]) == 0
    config, params, _ = RunDir(run).params()
    probe = probe_examples(config, text=TEXT)
    return {"path": root / "gpt2.html", "printed": out.getvalue(), "config": config,
            "params": params, "probe": probe, "results": written,
            "weights": attention_weights(config, params, probe["inputs"])}


def family_page(base: dict, path, batch: int = 2) -> dict:
    """The explorer of a tiny untrained model of ``base``'s family (one layer of two heads)
    on ``batch`` validation examples, written to ``path``."""
    config = tiny_config(base)
    params = init_params(config)
    probe = probe_examples(config, batch_size=batch)
    data = explorer_data(config, params, probe, title=config.model.family)
    path.write_text(render_page(data))
    return {"path": path, "config": config, "params": params, "probe": probe, "data": data}


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the file (skipped, naming the install, where there is none)."""
    try:
        from playwright.sync_api import Error, sync_playwright
    except ImportError:
        pytest.skip(f"playwright is not installed: {INSTALL}")
    executable = shutil.which("chromium") or shutil.which("chromium-browser")
    if executable is None:
        pytest.skip(f"no chromium on PATH: {INSTALL}")
    with sync_playwright() as playwright:
        try:
            launched = playwright.chromium.launch(executable_path=executable, args=FLAGS)
        except Error as error:
            pytest.skip(f"chromium does not start ({str(error).splitlines()[0]}): {INSTALL}")
        yield launched
        launched.close()


class Opened:
    """A page of ``browser`` opened on ``path``, with what it logged and requested."""

    def __init__(self, browser, path):
        self.page = browser.new_page(viewport={"width": 1280, "height": 900})
        self.errors, self.requests = [], []
        self.page.on("console", lambda m: m.type in ("error", "warning") and
                     self.errors.append(f"{m.type}: {m.text}"))
        self.page.on("pageerror", lambda error: self.errors.append(str(error)))
        self.page.on("request", lambda request: self.requests.append(request.url))
        self.url = path.as_uri()
        self.page.goto(self.url)
        self.page.wait_for_selector("body[data-ready=true]", state="attached", timeout=10_000)

    def run(self, script: str, *args):
        return self.page.evaluate(script, *args)

    def select(self, **change):
        self.run("change => window.attnjax.select(change)", change)

    def state(self) -> dict:
        return self.run("() => JSON.parse(JSON.stringify(window.attnjax.state))")

    def panel(self, view: str = "head") -> dict:
        return self.run("id => ({...document.getElementById(id).dataset})", f"{view}-focus")


@pytest.fixture(scope="module")
def gpt2_page(browser, decoder):
    opened = Opened(browser, decoder["path"])
    yield opened
    opened.page.close()


def shown(weights) -> np.ndarray:
    """Weights as the page holds them: ``round(255 w) / 255``."""
    return np.rint(np.asarray(weights, np.float64) * 255) / 255


def test_the_command_writes_one_file_that_loads_with_no_error_and_no_request(decoder,
                                                                             gpt2_page):
    printed = decoder["printed"].strip()
    assert printed.startswith(f"wrote {decoder['path']} (") and "2 x 4" in printed
    assert "patching.md" in printed and "knockout.md" in printed
    assert gpt2_page.errors == []
    assert gpt2_page.requests == [gpt2_page.url]          # no CDN, font, favicon or data file
    text = decoder["path"].read_text()
    assert "http://" not in text and "https://" not in text and "<link rel=\"stylesheet" not in text
    tokens = decoder["probe"]["inputs"][0]
    labels = token_labels(tokens, decoder["config"].data)
    page = gpt2_page.run("() => window.attnjax.data.examples[0].groups.self")
    assert page["queries"] == page["keys"] == labels               # the tokenizer's pieces
    assert any(label.startswith(" ") for label in labels)          # GPT-2's word-initial space


def test_the_weights_shown_for_a_query_are_the_runs(decoder, gpt2_page):
    layer, head, query = 1, 2, 9
    expected = decoder["weights"][layer, 0, head, query]
    gpt2_page.select(view="head", layer=layer, head=head, mode="lines")
    gpt2_page.page.hover(f"#head-figure .tok.query[data-index='{query}']")
    panel = gpt2_page.panel()
    assert (panel["kind"], panel["index"], panel["layer"], panel["head"]) == (
        "row", str(query), str(layer), str(head))
    weights = np.asarray(json.loads(panel["weights"]))
    np.testing.assert_allclose(weights, shown(expected), rtol=0, atol=1e-12)
    assert np.abs(weights - expected).max() <= 0.5 / 255 + 1e-7
    assert weights[query + 1:].sum() == 0                                   # causal
    # a key's column: the weight every query gives it
    key = 3
    gpt2_page.page.hover(f"#head-figure .tok.key[data-index='{key}']")
    panel = gpt2_page.panel()
    assert panel["kind"] == "column"
    np.testing.assert_allclose(json.loads(panel["weights"]),
                               shown(decoder["weights"][layer, 0, head, :, key]), atol=1e-12)
    # the matrix: a cell under the pointer is its query's row, with its key
    gpt2_page.select(mode="matrix")
    canvas = gpt2_page.page.locator("#head-figure canvas.matrix")
    layout = gpt2_page.run("() => document.querySelector('#head-figure canvas.matrix').layout")
    cell = layout["cell"]
    canvas.hover(position={"x": layout["left"] + (key + 0.5) * cell,
                           "y": layout["top"] + (query + 0.5) * cell})
    panel = gpt2_page.panel()
    assert (panel["kind"], panel["index"], panel["key"]) == ("row", str(query), str(key))
    np.testing.assert_allclose(json.loads(panel["weights"]), shown(expected), atol=1e-12)
    assert gpt2_page.errors == []


def test_the_keyboard_changes_head_layer_and_mode(gpt2_page):
    gpt2_page.select(view="head", layer=0, head=3, mode="lines")
    keyboard = gpt2_page.page.keyboard
    keyboard.press("ArrowRight")                             # past the last head: the first
    assert (gpt2_page.state()["layer"], gpt2_page.state()["head"]) == (0, 0)
    keyboard.press("ArrowDown")
    keyboard.press("ArrowRight")
    assert (gpt2_page.state()["layer"], gpt2_page.state()["head"]) == (1, 1)
    assert gpt2_page.run("() => [document.getElementById('layer').value, "
                         "document.getElementById('head').value]") == ["1", "1"]
    keyboard.press("ArrowUp")
    keyboard.press("ArrowLeft")
    assert (gpt2_page.state()["layer"], gpt2_page.state()["head"]) == (0, 0)
    keyboard.press("m")
    assert gpt2_page.state()["mode"] == "matrix"
    assert gpt2_page.page.locator("#head-figure canvas.matrix").count() == 1
    keyboard.press("m")
    assert gpt2_page.page.locator("#head-figure .tok.query").count() == len(
        gpt2_page.run("() => window.attnjax.data.examples[0].groups.self.queries"))
    assert "layer=0&head=0&mode=lines" in gpt2_page.run("() => location.hash")   # kept in the URL


def test_hovering_a_map_shows_its_statistics_and_the_patching_shares(decoder, gpt2_page):
    gpt2_page.select(view="model")
    assert gpt2_page.page.locator("#grid .cell").count() == LAYERS * HEADS
    gpt2_page.page.hover("#grid .cell[data-layer='1'][data-head='2']")
    tip = gpt2_page.page.locator("#tooltip")
    assert tip.is_visible() and tip.get_attribute("data-layer") == "1"
    rows = dict(gpt2_page.run("() => [...document.querySelectorAll('#tooltip tr')].map("
                              "tr => [tr.dataset.key.split(':').pop(), tr.lastChild.textContent])"))
    config, params, probe = decoder["config"], decoder["params"], decoder["probe"]
    stats = head_statistics(config, params, probe["inputs"])
    for name in ("entropy", "max_weight", "sink_mass", "prev_token", "induction"):
        assert float(rows[name]) == pytest.approx(stats[name][1, 2], rel=1e-3), name
    for column, values in decoder["results"].items():
        assert float(rows[column]) == pytest.approx(values[1, 2], abs=1e-9), column
    assert rows["importance (layer-normalised)"] == "\u2014"          # not measured: blank
    gpt2_page.page.mouse.move(5, 5)
    assert not tip.is_visible()
    gpt2_page.page.click("#grid .cell[data-layer='0'][data-head='1']")     # to its head view
    assert gpt2_page.state()["view"] == "head"
    assert (gpt2_page.state()["layer"], gpt2_page.state()["head"]) == (0, 1)


def test_the_table_sorts_and_the_overlay_draws_several_heads(decoder, gpt2_page):
    gpt2_page.select(view="table")
    assert gpt2_page.page.locator("#stats tbody tr").count() == LAYERS * HEADS
    gpt2_page.page.click("#stats th[data-key='entropy']")
    read = ("() => [...document.querySelectorAll('#stats tbody tr')].map(tr => "
            "[+tr.dataset.layer, +tr.dataset.head])")
    order = gpt2_page.run(read)
    entropy = head_statistics(decoder["config"], decoder["params"],
                              decoder["probe"]["inputs"])["entropy"]
    values = [entropy[l, h] for l, h in order]
    assert values == sorted(values, reverse=True)                  # first click: largest first
    gpt2_page.page.click("#stats th[data-key='entropy']")
    assert gpt2_page.run(read) == order[::-1]
    gpt2_page.select(view="overlay", layer=0, head=0, overlay=[])   # starts with L0 H0
    gpt2_page.page.select_option("#overlay-layer", "0")
    gpt2_page.page.click("#overlay-layer-all")                     # and the rest of layer 0
    assert gpt2_page.page.locator("#chips .chip").count() == HEADS
    gpt2_page.page.hover("#overlay-figure .tok.query[data-index='5']")
    panel = gpt2_page.panel("overlay")
    np.testing.assert_allclose(json.loads(panel["weights"]),
                               shown(decoder["weights"][0, 0, 0, 5]), atol=1e-12)
    assert gpt2_page.errors == []


def test_an_encoder_batch_renders_without_its_pads(browser, tmp_path):
    made = family_page(TINY_MLM, tmp_path / "encoder.html")
    opened = Opened(browser, made["path"])
    real = made["probe"]["token_mask"].sum(1)
    assert real.min() < made["probe"]["inputs"].shape[1]           # a padded example
    for b, count in enumerate(real):
        assert len(opened.run(f"() => window.attnjax.data.examples[{b}].groups.self.queries")) \
            == count
    columns = [c["key"] for c in made["data"]["groups"][0]["columns"]]
    assert "cls" in columns and "sep" in columns
    weights = attention_weights(made["config"], made["params"], made["probe"]["inputs"],
                                model_arguments(made["config"], made["probe"]))
    example = int(np.argmin(real))
    keep = np.flatnonzero(made["probe"]["token_mask"][example])
    opened.select(view="head", example=example, layer=0, head=1, mode="matrix")
    for query in (0, len(keep) - 1):
        row = opened.run(f"() => window.attnjax.row('self', {example}, 0, 1, {query})")
        np.testing.assert_allclose(row, shown(weights[0, example, 1, keep[query]][keep]),
                                   atol=1e-12)
    assert opened.page.locator("#head-figure canvas.matrix").count() == 1
    opened.select(view="model")
    assert opened.page.locator("#grid .cell canvas").count() == 2
    assert opened.errors == [] and opened.requests == [opened.url]
    opened.page.close()


def test_an_encoder_decoder_shows_its_cross_attention_and_encoder_heads(browser, tmp_path):
    made = family_page(TINY_SEQ2SEQ, tmp_path / "seq2seq.html", batch=1)
    opened = Opened(browser, made["path"])
    groups = opened.run("() => window.attnjax.data.groups.map(g => g.name)")
    assert groups == ["self", "cross", "encoder"]
    probe = made["probe"]
    cross = stream_attention(made["config"], made["params"], probe["inputs"],
                             model_arguments(made["config"], probe))["cross"]
    target = np.flatnonzero(probe["weights"][0] > 0)
    source = np.flatnonzero(probe["source_mask"][0])
    opened.select(view="head", group="cross", layer=0, head=1, mode="lines")
    assert opened.page.locator("#head-figure .tok.key").count() == source.size
    opened.page.hover("#head-figure .tok.query[data-index='2']")
    np.testing.assert_allclose(json.loads(opened.panel()["weights"]),
                               shown(cross[0, 0, 1, target[2]][source]), atol=1e-12)
    assert "alignment" in [c["key"] for c in made["data"]["groups"][1]["columns"]]
    for group in groups:
        opened.select(view="model", group=group)
        assert opened.page.locator("#grid .cell canvas").count() == 2
    assert opened.errors == [] and opened.requests == [opened.url]
    opened.page.close()


# ------------------------------------------------------------ without a browser

def test_max_tokens_cuts_what_is_shown_not_the_statistics(decoder):
    config, params, probe = decoder["config"], decoder["params"], decoder["probe"]
    whole = explorer_data(config, params, probe, title="t")
    cut = explorer_data(config, params, probe, title="t", max_tokens=5)
    shown_cut = cut["examples"][0]["groups"]["self"]
    T = probe["inputs"].shape[1]
    assert len(shown_cut["queries"]) == 5 and shown_cut["note"] == f"first 5 of {T} tokens"
    assert len(base64.b64decode(shown_cut["weights"])) == LAYERS * HEADS * 5 * 5   # one byte each
    assert cut["groups"] == whole["groups"]                        # every statistic the same


def test_tokens_and_titles_cannot_break_out_of_the_page():
    hostile = "</script><!--<script>alert(1)</script>__JS__"
    page = render_page({"title": hostile, "groups": [], "examples": [{"name": hostile}]})
    assert page.count("<script") == 2 and page.count("</script>") == 2   # the data, the code
    assert f"<title>{html.escape(hostile)}</title>" in page
    data = page.split('id="attnjax-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(data)["examples"][0]["name"] == hostile


def test_result_tables_are_read_by_group_and_a_misfit_is_left_out(tmp_path, decoder, capsys):
    (tmp_path / "knockout.md").write_text(
        "| head | knockout delta loss | importance (layer-normalised) |\n|---|---|---|\n"
        "| L0.H0 | +0.5000 | 1.000 |\n| L0.H1 | -0.2500 | — |\n\n## The cross-attention heads"
        "\n\n| cross head | knockout delta loss | importance (layer-normalised) |\n|---|---|---|\n"
        "| L0.H0 | +0.1000 | 0.300 |\n")
    tables = read_result_tables(tmp_path / "knockout.md")
    np.testing.assert_array_equal(tables["self"]["knockout delta loss"], [[0.5, -0.25]])
    assert np.isnan(tables["self"]["importance (layer-normalised)"][0, 1])
    np.testing.assert_array_equal(tables["cross"]["importance (layer-normalised)"], [[0.3]])
    data = explorer_data(decoder["config"], decoder["params"], decoder["probe"], title="t",
                         results=[tmp_path / "knockout.md"])
    assert [c["kind"] for c in data["groups"][0]["columns"]].count("share") == 0
    assert "its 'knockout delta loss' table has [1, 2] heads, the model [2, 4]; left out" \
        in capsys.readouterr().err


def test_bad_input_is_one_line_before_any_work(decoder, tmp_path, capsys):
    run = str(decoder["path"].parent / "gpt2")
    for args, fragment in (
            (["--text", "a", "--batch", "2", "--out", str(tmp_path / "x.html")],
             "give --text or --batch, not both"),
            (["--out", str(tmp_path)], f"--out {str(tmp_path)!r} is a directory, not a file"),
            (["--max-tokens", "0", "--out", str(tmp_path / "x.html")],
             "--max-tokens must be in [1, "),
            (["--results", str(tmp_path / "none"), "--out", str(tmp_path / "x.html")],
             "--results")):
        code, _, err = run_cli(capsys, "explore", run, *args)
        assert code == 2 and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "x.html").exists()
    raises_one_line(lambda: explorer_data(decoder["config"], decoder["params"],
                                          decoder["probe"], title="t", max_tokens=0),
                    "max_tokens must be >= 1")


def test_attention_prints_the_explore_command_of_its_probe():
    args = argparse.Namespace(workdir="runs/base", overrides=["model.attention.kernel=chunked"],
                              text="def main(argv):", batch=None, length=None,
                              checkpoint="latest", out="runs/base/attention")
    assert explore_command(args) == (
        "attnjax explore runs/base model.attention.kernel=chunked --text 'def main(argv):' "
        "--checkpoint latest --out runs/base/attention/explorer.html")
