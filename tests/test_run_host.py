"""``runs.host`` as a type (``evidence.RunHost``): every key it holds read into a field,
written back as it was read, an unknown key kept, a newer record refused."""

from __future__ import annotations

import pytest

from bisect_harness.evidence import VERSION_KEY, NewerRecordError, ResumeRecord, RunHost, RunOptions

STORED = {  # runs.host as a run of the harness before the record had a version wrote it
    "hostname": "gpu-7", "kernel": "6.1", "gpus": [{"uuid": "GPU-1", "driver_version": "550"}],
    "harness_process": {"pid": 4242, "hostname": "gpu-7", "create_time": 1700000000.5},
    "backend": {"name": "local", "slots": 2, "device_sets": [{"slot": 0}, {"slot": 1}]},
    "order_seed": 99,
    "run_options": {"aa_check": True, "hypotheses": ["h1", "h2"], "profile": False},
    "resumed": [{"at": "2026-01-02T03:04:05", "previous_status": "interrupted", "previous_error": "killed",
                 "host_fingerprint": "abc", "hostname": "gpu-7", "counted_boot_ids": [1, 2],
                 "counted_ok_boot_ids": [1], "other_host_boot_ids": [], "other_host_ok_boot_ids": [],
                 "cut_short_boot_ids": [3], "order_stream": "99:resume:1"}],
}


def test_every_key_reads_into_a_field_and_writes_back_as_it_was():
    host = RunHost.from_json(STORED)
    assert host.machine == {"hostname": "gpu-7", "kernel": "6.1", "gpus": STORED["gpus"]}
    assert host.owner.pid == 4242 and host.owner.hostname == "gpu-7" and host.owner.create_time == 1700000000.5
    assert host.backend["slots"] == 2 and host.order_seed == 99
    assert host.options == RunOptions(aa_check=True, hypotheses=("h1", "h2"), profile=False)
    (rec,) = host.resumed
    assert isinstance(rec, ResumeRecord) and rec.cut_short_boot_ids == (3,) and rec.previous_error == "killed"
    written = host.to_json()
    assert written.pop(VERSION_KEY) == 1
    assert written == STORED
    assert RunHost.from_json(host.to_json()) == host


def test_a_run_that_recorded_nothing_reads_empty_and_an_unknown_key_is_kept():
    empty = RunHost.from_json(None)
    assert empty.owner is None and empty.options is None and empty.order_seed is None and empty.resumed == ()
    newer = {**STORED, "a_key_of_a_later_harness": {"x": 1},
             "run_options": {**STORED["run_options"], "later_option": 3}}
    host = RunHost.from_json(newer)
    assert host.machine["a_key_of_a_later_harness"] == {"x": 1} and host.options.extra == {"later_option": 3}
    back = host.to_json()
    back.pop(VERSION_KEY)
    assert back == newer


def test_a_record_of_a_newer_harness_is_refused():
    with pytest.raises(NewerRecordError, match="upgrade bisect-harness"):
        RunHost.from_json({**STORED, VERSION_KEY: 2})
