"""Analysis of runs and sweeps: reports and plots, attention diagnostics, head importance,
checkpoint comparison. Each module has one job; import them directly."""
