"""docs/PERFORMANCE.md is rendered from the benchmark JSON files: each present benchmark gets
its section with the machine it ran on, its table (values as measured) and its plots."""

import json

from attnjax.bench.report import performance_markdown, table


def test_table_formats_values_and_leaves_missing_cells_blank():
    lines = table([{"a": "x", "b": 1234.5, "c": 0.5}, {"a": "y", "b": 7}],
                  [("name", "a"), ("big", "b"), ("ratio", "c")])
    assert lines == ["| name | big | ratio |", "|---|---:|---:|", "| x | 1,234 | 0.5 |",
                     "| y | 7 |  |"]


def test_performance_page_from_results(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    attention = [{"kernel": k, "length": n, "forward_s": 0.01 * n / 1024 * f,
                  "grad_s": 0.03 * n / 1024 * f, "grad_temp_mb": 64.0 * f,
                  "grad_time_vs_reference": f, "grad_mem_vs_reference": f}
                 for n in (1024, 4096) for k, f in (("reference", 1.0), ("chunked", 0.5))]
    (results / "attention.json").write_text(json.dumps({"machine": "Test CPU, 2 cores",
                                                        "rows": attention}))
    train = [{"setting": "b", "kernel": "triangular", "steps_per_dispatch": 1,
              "tokens_per_s": 9000.0, "mfu": 0.1},
             {"setting": "b", "kernel": "triangular", "steps_per_dispatch": 10,
              "tokens_per_s": 12000.0, "mfu": 0.12,
              "peer_tokens_per_s": 10000.0, "peer_ratio": 1.2}]
    (results / "train.json").write_text(json.dumps({"rows": train}))
    out = tmp_path / "docs" / "PERFORMANCE.md"
    out.parent.mkdir()
    page = performance_markdown(results, out).read_text()
    assert "Measured on Test CPU, 2 cores." in page
    assert "Measured on a machine not recorded." in page              # train.json lacks it
    assert "| chunked | 4,096 | 20 | 60 | 32 | 0.5 | 0.5 |" in page
    assert "| b | triangular | 10 | 12,000 | 0.12 | 10,000 | 1.2 |" in page
    assert "## Sweep launchers" not in page                              # no sweep.json
    for name in ("attention", "train"):
        png = out.parent / "performance" / f"{name}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and f"(performance/{name}.png)" in page
