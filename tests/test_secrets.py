"""Secrets never leave the process: the module's rules, and a real demo run whose
ledger, journal, logs, output and dry-run are searched byte by byte for the values."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import textwrap
from pathlib import Path

import pytest

from bisect_harness import secrets
from bisect_harness.secrets import is_secret, mask, redact_argv, redact_env, redact_obj, redact_text, redact_yaml

from helpers import SMALL_BENCH, harness, last_json, query, write_spec

# --------------------------------------------------------------------------- the module


@pytest.mark.parametrize("name", ["HF_TOKEN", "MY_API_KEY", "api-key", "--api-key", "DB_PASSWORD", "AWS_SECRET",
                                  "aws_secret_access_key", "GOOGLE_CREDENTIALS", "APIKEY", "hub-token"])
def test_secret_looking_names(name):
    assert is_secret(name)


@pytest.mark.parametrize("name", ["NCCL_NVLS_ENABLE", "max_tokens", "max-num-batched-tokens", "attention-mode",
                                  "MY_VAR", "keyboard", "DEMO_COMM_TUNING"])
def test_ordinary_names(name):
    assert not is_secret(name)


def test_extra_names_are_exact_and_case_blind():
    assert is_secret("MY_VAR", ["my_var"])
    assert is_secret("--my-var", ["MY_VAR"])
    assert not is_secret("MY_VARIABLE", ["MY_VAR"])


def test_mask_is_a_short_stable_hash_that_tells_values_apart():
    a, b = mask("hf_aaaa"), mask("hf_bbbb")
    assert a == mask("hf_aaaa") and a != b
    assert a == f"<secret sha256:{hashlib.sha256(b'hf_aaaa').hexdigest()[:8]}>"
    assert "hf_aaaa" not in a


def test_redact_env_copies_and_masks_only_secret_names():
    env = {"HF_TOKEN": "x", "NCCL_NVLS_ENABLE": "0"}
    out = redact_env(env)
    assert out == {"HF_TOKEN": mask("x"), "NCCL_NVLS_ENABLE": "0"}
    assert env["HF_TOKEN"] == "x"  # the caller's mapping (what the process gets) is untouched
    assert redact_env({"MY_VAR": "v"}, ["MY_VAR"]) == {"MY_VAR": mask("v")}
    assert redact_env({"use-token": True, "api-key": None}) == {"use-token": True, "api-key": None}


def test_redact_argv_both_spellings_and_named_flags():
    argv = ["serve", "--api-key", "k1", "--token=k2", "--port", "8000", "--hub", "k3"]
    assert redact_argv(argv, flag_names=["hub"]) == [
        "serve", "--api-key", mask("k1"), f"--token={mask('k2')}", "--port", "8000", "--hub", mask("k3")]
    assert argv[2] == "k1"


def test_redact_text_long_values_only():
    text = "command: serve --api-key sekrit-123 --port 1"
    assert redact_text(text, ["sekrit-123", "1"]) == f"command: serve --api-key {mask('sekrit-123')} --port 1"


def test_redact_yaml_masks_values_of_secret_keys_whatever_their_length():
    text = textwrap.dedent("""\
        engine:
          api_key_env: SERVER_KEY
          env:
            HF_TOKEN: "ab"   # short, still masked
            NCCL_ALGO: ring
        defaults:
          secret_names: [MY_VAR]
        """)
    out = redact_yaml(text, values=[])
    assert 'HF_TOKEN: ' + mask("ab") + "   # short, still masked" in out
    assert "api_key_env: SERVER_KEY" in out and "NCCL_ALGO: ring" in out and "secret_names: [MY_VAR]" in out


def test_redact_obj_walks_json_and_returns_the_same_object_when_clean():
    obj = {"a": ["x --api-key sekrit-456", {"b": "sekrit-456"}], "max_tokens": 5}
    out = redact_obj(obj, ["sekrit-456"])
    assert "sekrit-456" not in json.dumps(out) and out["max_tokens"] == 5
    clean = {"a": ["nothing"]}
    assert redact_obj(clean, ["sekrit-456"]) is clean


def test_spec_registers_its_secret_values_and_names(tmp_path):
    from bisect_harness.spec import load_spec

    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "demo", "env": {"UNIT_TOKEN": "unit-tok-789"}},
                      defaults={"secret_names": ["UNIT_VAR"]},
                      hypotheses=[{"id": "h", "statement": "s", "baseline": {"commit": "HEAD"},
                                   "treatment": {"commit": "HEAD", "env": {"UNIT_VAR": "unit-var-789"}},
                                   "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}])
    s = load_spec(spec)
    assert s.defaults.secret_names == ("UNIT_VAR",)
    assert {"unit-tok-789", "unit-var-789"} <= secrets.known_values()
    assert is_secret("UNIT_VAR")


def test_a_literal_key_in_a_launch_and_a_password_in_a_url_are_secrets(tmp_path, monkeypatch):
    from bisect_harness.engines.attach import api_key
    from bisect_harness.spec import load_spec

    hyp = {"id": "h", "statement": "s", "baseline": {}, "treatment": {"env": {"X": "1"}},
           "metric": "tok_s", "expect": "decrease", "min_effect": "10%"}
    load_spec(write_spec(tmp_path / "l.yaml", hypotheses=[hyp], engine={
        "preset": "openai", "launch": ["my-server", "--port", "{port}", "--api-key", "sk-literal-4242",
                                       "--hf-token=hf-literal-4242"]}))
    attached = {**hyp, "baseline": {"base_url": "http://alice:pa55-word-4242@127.0.0.1:9/"},
                "treatment": {"base_url": "http://127.0.0.1:10/"}}
    load_spec(write_spec(tmp_path / "u.yaml", hypotheses=[attached], engine={
        "preset": "openai", "base_url": "http://127.0.0.1:9/"}))
    monkeypatch.setenv("BH_TEST_API_KEY", "sk-from-env-4242")
    assert api_key("BH_TEST_API_KEY") == "sk-from-env-4242"
    echoed = ("HTTP 401: you sent Authorization: Bearer sk-from-env-4242 to http://alice:pa55-word-4242@127.0.0.1:9/ "
              "from my-server --api-key sk-literal-4242 --hf-token=hf-literal-4242")
    shown = secrets.redact_text(echoed)
    for value in ("sk-from-env-4242", "pa55-word-4242", "alice:pa55", "sk-literal-4242", "hf-literal-4242"):
        assert value not in shown, shown
    assert "http://<secret sha256:" in shown and "@127.0.0.1:9/" in shown


def test_secret_names_must_be_a_list_of_strings(tmp_path):
    spec = write_spec(tmp_path / "h.yaml", engine={"preset": "demo"}, defaults={"secret_names": "MY_VAR"},
                      hypotheses=[{"id": "h", "statement": "s", "baseline": {"commit": "HEAD"},
                                   "treatment": {"commit": "HEAD"}, "metric": "tok_s", "expect": "decrease",
                                   "min_effect": "10%"}])
    proc = harness("run", spec, "--dry-run")
    assert proc.returncode == 2 and "defaults.secret_names" in proc.stderr, proc.stderr


def test_doctor_masks_secret_looking_nccl_variables():
    proc = harness("doctor", "--json", "--seconds", "0.2",
                   env={**__import__("os").environ, "NCCL_IB_TOKEN": "nccl-doctor-secret", "NCCL_ALGO": "ring"})
    assert proc.returncode == 0, proc.stderr
    assert "nccl-doctor-secret" not in proc.stdout + proc.stderr
    nccl = json.loads(proc.stdout.strip().splitlines()[-1])["calibration"]["nccl_env"]
    assert nccl == {"NCCL_ALGO": "ring", "NCCL_IB_TOKEN": mask("nccl-doctor-secret")}


# --------------------------------------------------------------------------- a real run

TOKEN_A, TOKEN_B = "hf_baselineSECRET_0001", "hf_treatmentSECRET_0002"
MY_VAR = "plainly-named-secret-0003"
FLAG = "flag-secret-value-0004"
SECRET_VALUES = (TOKEN_A, TOKEN_B, MY_VAR, FLAG)

# Wraps the demo server: takes --hub-token off the argv, writes the hashes of what
# it received (flag and env) to a proof file, then runs the real server.
WRAPPER = textwrap.dedent("""\
    import hashlib, json, os, sys
    argv = sys.argv[1:]
    i = argv.index("--hub-token")
    flag = argv[i + 1]
    del argv[i:i + 2]
    h = lambda v: hashlib.sha256(v.encode()).hexdigest()
    with open(os.environ["PROOF_FILE"], "a") as f:
        f.write(json.dumps({"flag": h(flag), "HF_TOKEN": h(os.environ["HF_TOKEN"]),
                            "MY_VAR": h(os.environ["MY_VAR"])}) + "\\n")
    os.execv(sys.executable, [sys.executable, "serve.py", *argv])
    """)


@pytest.fixture(scope="module")
def secret_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("secrets")
    wrapper = root / "wrap_serve.py"
    wrapper.write_text(WRAPPER)
    proof = root / "proof.jsonl"
    engine = {"preset": "demo", "launch": ["{python}", str(wrapper), "--host", "{host}", "--port", "{port}"],
              "env": {"MY_VAR": MY_VAR, "PROOF_FILE": str(proof)}, "flags": {"hub-token": FLAG}}
    hyps = [{"id": "token-ab", "statement": "The token does not change decode speed by 50%.",
             "baseline": {"commit": "HEAD", "env": {"HF_TOKEN": TOKEN_A}},
             "treatment": {"commit": "HEAD", "env": {"HF_TOKEN": TOKEN_B}},
             "metric": "tok_s", "expect": "decrease", "min_effect": "50%"}]
    spec = write_spec(root / "hypotheses.yaml", engine=engine, benchmark=SMALL_BENCH,
                      defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2,
                                "host_preflight_s": 0, "secret_names": ["MY_VAR"]},
                      hypotheses=hyps)
    db, journal_dir = root / "r.db", root / "exp"
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir", journal_dir,
                   "--cache-dir", root / "cache", "--json", cwd=root, timeout=600)
    dry = harness("run", spec, "--dry-run", "--cache-dir", root / "cache", cwd=root)
    dry_json = harness("run", spec, "--dry-run", "--json", "--cache-dir", root / "cache", cwd=root)
    return {"root": root, "db": db, "journal_dir": journal_dir, "proc": proc, "dry": dry, "dry_json": dry_json,
            "proof": proof}


def _no_secret_in(blob: bytes, where: str) -> None:
    for v in SECRET_VALUES:
        assert v.encode() not in blob, f"secret {v!r} found in {where}"


@pytest.mark.slow
def test_the_server_received_the_real_values(secret_run):
    proc = secret_run["proc"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    h = lambda v: hashlib.sha256(v.encode()).hexdigest()  # noqa: E731
    seen = [json.loads(line) for line in secret_run["proof"].read_text().splitlines()]
    assert len(seen) == 4  # two boots per arm
    assert {s["HF_TOKEN"] for s in seen} == {h(TOKEN_A), h(TOKEN_B)}
    assert all(s["flag"] == h(FLAG) and s["MY_VAR"] == h(MY_VAR) for s in seen)
    # the harness's own env check found the real value in the server's root process
    # (compared there, then stored masked); the demo's workers get a scrubbed env at HEAD
    reports = [json.loads(r[0]) for r in query(secret_run["db"], "SELECT env_report FROM boots")]
    assert len(reports) == 4
    for rep in reports:
        names = {v["name"]: v for v in rep["vars"]}
        for name in ("HF_TOKEN", "MY_VAR"):
            assert rep["root_pid"] in names[name]["matched"], rep
            assert names[name]["requested"].startswith("<secret sha256:")


@pytest.mark.slow
def test_no_secret_in_the_ledger_file(secret_run):
    db = secret_run["db"]
    con = sqlite3.connect(db)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.close()
    for p in db.parent.glob(db.name + "*"):
        _no_secret_in(p.read_bytes(), str(p))
    labels = [r[0] for r in query(db, "SELECT label FROM configs")]
    assert len(labels) == 2 and labels[0] != labels[1]  # the two tokens still make two configs
    assert any(mask(TOKEN_A) in lab for lab in labels) and any(mask(TOKEN_B) in lab for lab in labels)
    env = [json.loads(r[0]) for r in query(db, "SELECT env FROM configs")]
    assert all(e["MY_VAR"] == mask(MY_VAR) for e in env)
    argv = [json.loads(r[0]) for r in query(db, "SELECT argv FROM boots")]
    assert all(a[a.index("--hub-token") + 1] == mask(FLAG) for a in argv)


@pytest.mark.slow
def test_no_secret_in_journal_logs_or_output(secret_run):
    files = [p for p in secret_run["journal_dir"].rglob("*") if p.is_file()]
    assert any(p.suffix == ".md" for p in files) and any(p.suffix == ".log" for p in files), files
    for p in files:
        _no_secret_in(p.read_bytes(), str(p))
    # the cache's build logs and build markers (written by the harness, argv included)
    cached = [p for p in (secret_run["root"] / "cache").rglob("*")
              if p.is_file() and (p.suffix in (".log", ".json") or p.name.startswith("."))
              and "site-packages" not in p.parts]
    assert cached
    for p in cached:
        _no_secret_in(p.read_bytes(), str(p))
    proc = secret_run["proc"]
    _no_secret_in((proc.stdout + proc.stderr).encode(), "the run's stdout/stderr")
    assert last_json(proc.stdout)["hypotheses"]


@pytest.mark.slow
def test_no_secret_in_the_dry_run(secret_run):
    for key in ("dry", "dry_json"):
        p = secret_run[key]
        assert p.returncode == 0, p.stderr
        _no_secret_in((p.stdout + p.stderr).encode(), key)
    assert mask(FLAG) in secret_run["dry"].stdout and mask(TOKEN_A) in secret_run["dry"].stdout
    obj = last_json(secret_run["dry_json"].stdout)
    assert {c["env"]["HF_TOKEN"] for c in obj["configs"]} == {mask(TOKEN_A), mask(TOKEN_B)}


def test_error_messages_are_masked(tmp_path):
    # a server that exits at once: the error names the command, whose flag value is a secret
    spec = write_spec(tmp_path / "h.yaml",
                      engine={"preset": "openai",
                              "launch": ["{python}", "-c", "import sys; sys.exit(3)", "--port", "{port}"],
                              "flags": {"api-key": "error-secret-0005"}, "ready_timeout_s": 5},
                      benchmark=SMALL_BENCH,
                      defaults={"samples_per_boot": 1, "boots_per_arm": 2, "max_boots_per_arm": 2,
                                "host_preflight_s": 0},
                      hypotheses=[{"id": "h", "statement": "s", "baseline": {"env": {"A": "1"}},
                                   "treatment": {"env": {"A": "2"}}, "metric": "tok_s", "expect": "decrease",
                                   "min_effect": "10%"}])
    db = tmp_path / "r.db"
    proc = harness("run", spec, "--no-calibration", "--ledger", f"sqlite:///{db}", "--journal-dir",
                   tmp_path / "exp", cwd=tmp_path, timeout=120)
    out = (proc.stdout + proc.stderr).encode()
    assert b"error-secret-0005" not in out
    for p in [*tmp_path.rglob("*")]:
        if p.is_file() and p.name != "h.yaml":
            assert b"error-secret-0005" not in p.read_bytes(), p
    failures = [r[0] for r in query(db, "SELECT failure FROM boots") if r[0]]
    assert failures and all(mask("error-secret-0005") in f for f in failures), failures


def test_redaction_is_idempotent():
    """Rows are redacted at every flush: a marker is never masked again."""
    env, argv = {"HF_TOKEN": "abcd"}, ["--api-key", "abcd", "--token=abcd"]
    assert redact_env(redact_env(env)) == redact_env(env)
    assert redact_argv(redact_argv(argv)) == redact_argv(argv)
    text = "HF_TOKEN: abcd\n"
    assert redact_yaml(redact_yaml(text, values=[]), values=[]) == redact_yaml(text, values=[])
