"""``harness report`` on a ledger of 200 runs: its wall time and its largest page.

The ledger is made as ``tests/test_html_report.py`` makes its own: real ``harness``
commands in this process, their boots answered by the mock backend (two runs of a
hypothesis that bisects its regression, a four-point load curve, ten nights of a
nightly series whose first slow night alerts and bisects); then 200 runs are
copied from those rows through the ledger's session, a copy of each run in turn.
``harness report`` is then run as a command of its own (a fresh process, so its
imports count) ``--repeat`` times over that ledger, and the bench prints the median
wall time, the pages written, the largest page and the index's size.

    python bench/bench_report.py [--runs 200] [--repeat 3]

Measured on a quiet 2-core host, 200 runs (399 pages: the index, 200 runs, one
nightly series, 197 comparisons): 6.4 s median wall time for ``harness report`` as a
fresh process (6.3 to 6.9 s over 3 repeats, 4.4 to 4.9 s of it writing the pages);
the largest page is the nightly series' (one row a night), 99 KiB; the index, 98 KiB.
Earlier, on a host busy with other test runs (load average 3 to 4): 11.0 s median.
``tests/test_html_report.py`` holds the index under 512 KiB and its load and a sort
under 10 s in Chromium.

The last line printed is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=200, help="runs in the ledger the report is written from")
    parser.add_argument("--repeat", type=int, default=3, help="times `harness report` is run")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
        root = Path(tmp)
        os.environ.setdefault("BISECT_HARNESS_CACHE", str(root / "cache"))
        from test_html_report import copy_runs, make_ledger

        made_at = time.monotonic()
        source = make_ledger(root / "source")
        url = f"sqlite:///{root / 'many.db'}"
        copy_runs(source["url"], url, args.runs)
        made_s = time.monotonic() - made_at
        walls = []
        for k in range(args.repeat):
            out = root / f"report-{k}"
            started = time.monotonic()
            proc = subprocess.run([sys.executable, "-m", "bisect_harness.cli", "report", "--ledger", url, "--out",
                                   str(out)], capture_output=True, text=True, cwd=root,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=1800)
            walls.append(time.monotonic() - started)
            if proc.returncode != 0:
                raise SystemExit(f"harness report failed ({proc.returncode}): {proc.stderr[-2000:]}")
            print(f"repeat {k + 1}: {walls[-1]:.1f} s; {proc.stdout.strip()}", file=sys.stderr)
        pages = sorted(p for p in out.rglob("*.html"))
        sizes = {p.relative_to(out).as_posix(): p.stat().st_size for p in pages}
        largest = max(sizes, key=sizes.get)
        print(json.dumps({"runs": args.runs, "pages": len(pages), "wall_s": round(statistics.median(walls), 2),
                          "wall_s_each": [round(w, 2) for w in walls], "largest_page": largest,
                          "largest_page_kib": round(sizes[largest] / 1024, 1),
                          "index_kib": round(sizes["index.html"] / 1024, 1), "ledger_made_s": round(made_s, 1)}))


if __name__ == "__main__":
    main()
