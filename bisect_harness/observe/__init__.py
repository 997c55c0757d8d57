"""What really ran and where: provenance (env per process, flags, host), contention,
calibration, the engine's identity, mechanisms seen in the measured window, traces, host
state and drift."""
