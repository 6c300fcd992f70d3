"""The kernel benchmark runs with the requested dtype and writes what it measured (no timing
assertions: speed is measured by ``attnjax bench``, not asserted)."""

import json

from attnjax import bench


def test_attention_benchmark_measures_the_requested_dtype(tmp_path, capsys):
    out = tmp_path / "attention.json"
    rows = bench.run(lengths=[32], kernels=["reference", "chunked"], out=str(out),
                     dtype="bfloat16", heads=2, head_dim=8)
    written = json.loads(out.read_text())["rows"]
    assert [r["kernel"] for r in written] == ["reference", "chunked"] == [r["kernel"] for r in rows]
    assert all(r["dtype"] == "bfloat16" and r["length"] == 32 for r in written)
    assert all(r["forward_s"] > 0 and r["grad_temp_mb"] >= 0 for r in written)
    assert written[0]["grad_mem_vs_reference"] == 1.0
    assert "bfloat16" in capsys.readouterr().out
