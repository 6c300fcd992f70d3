"""The benchmarks of ``attnjax bench WHAT`` (``make bench`` runs them all), one module per WHAT,
each printing a table and writing its JSON to ``benchmarks/results/``; ``report`` renders
docs/PERFORMANCE.md from that JSON.

- ``attention``: compiled memory and time of each attention kernel, forward and gradient
- ``train``: training tokens/s and model-FLOPs utilisation; at 10 steps per dispatch the
  framework tax against a plain Flax peer (``peer``: the comparison, ``peer_gpt``: the peer)
- ``sweep``: one sweep with each launcher against its arithmetic floor
- ``memory``: compiled memory of a training step, not run
- ``generate``: decoding with and without the KV cache
- ``eval``: evaluation throughput against tokens per forward pass
- ``startup``: per-run overhead and what the compilation cache saves
- ``report``: docs/PERFORMANCE.md from ``benchmarks/results/*.json``

Shared below them: ``common`` (``median_seconds``, ``write_json``), ``flops`` (model FLOPs
and the matmul peak, re-exported here) and ``throughput`` (attnjax's training loop, timed).
Imports point one way: train -> peer -> throughput.
"""

from attnjax.bench.flops import matmul_peak_flops, model_flops_per_token, run_flops
