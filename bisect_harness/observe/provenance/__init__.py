"""Know what really ran. Five questions are answered from data at every boot, one
module each:

* :mod:`.env` -- did the requested env vars reach the root server process *and
  every process it spawned*? (:func:`env_report`)
* :mod:`.flags` -- do the server's effective arguments (its server-info endpoint)
  agree with the flags we asked for? (:func:`flag_report`; llama.cpp's context,
  reported a slot at a time, by :mod:`.slot_context`)
* :mod:`.host` -- what host is this: hostname, kernel, boot id, CPU governor,
  packages, the engine commit, and per GPU the clocks, thermals, power and
  throttle reasons through NVML (:func:`collect_host`)
* :mod:`.listening` -- does the server's tree listen beyond loopback?
  (:func:`listening_report`)
* :mod:`.sampling` -- what happened during the benchmark window
  (:class:`GpuSampler`, :class:`SamplerSummary`)

Every result is a frozen dataclass with ``to_dict()`` (JSON-ready) and
``from_dict()``, so the ledger stores it as JSON. The names below are the
package's public face; import them from ``bisect_harness.observe.provenance``.

Example::

    report = env_report(server.pid, {"NCCL_NVLS_ENABLE": "0"})
    if not report.ok:
        print(report.describe())
"""

# MATCHED, MISMATCHED, NOT_REPORTED, SCHEMA_VERSION and _check_schema are imported by name
# elsewhere (tests, calibration) but are not part of __all__, as before the split.
from bisect_harness.observe.provenance._schema import SCHEMA_VERSION, _check_schema  # noqa: F401
from bisect_harness.observe.provenance.env import EnvReport, ProcessEnv, VarReport, env_report
from bisect_harness.observe.provenance.flags import (
    DEFAULT_FLAG_ALIASES, MATCHED, MISMATCHED, NOT_REPORTED, FlagCheck, FlagReport, flag_report, normalise_flag,
    values_match,
)
from bisect_harness.observe.provenance.listening import ListeningReport, ListeningSocket, listening_report
from bisect_harness.observe.provenance.host import (
    BENIGN_THROTTLE_REASONS, THROTTLE_REASONS, GpuInfo, HostInfo, collect_host, cpu_governor,
    decode_throttle_reasons, engine_state, packages_fingerprint, read_gpu, read_gpus,
)
from bisect_harness.observe.provenance.sampling import GpuSampler, GpuSummary, SamplerSummary, Stat, sample_gpu

__all__ = [
    "BENIGN_THROTTLE_REASONS", "DEFAULT_FLAG_ALIASES", "EnvReport", "FlagCheck", "FlagReport",
    "GpuInfo", "GpuSampler", "ListeningReport", "ListeningSocket", "GpuSummary", "HostInfo", "ProcessEnv", "SamplerSummary", "Stat",
    "THROTTLE_REASONS", "VarReport", "collect_host", "cpu_governor", "decode_throttle_reasons",
    "engine_state", "env_report", "flag_report", "listening_report", "normalise_flag", "packages_fingerprint",
    "read_gpu", "read_gpus", "sample_gpu", "values_match",
]
