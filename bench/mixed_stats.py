#!/usr/bin/env python3
"""Summarise one bench/mixed.sh measurement: two oha runs at once (GET and POST), each written as
oha's JSON summary (--output-format json) and as its per-request sqlite database (--db-url).

    python3 bench/mixed_stats.py DURATION_S GET_JSON POST_JSON GET_DB POST_DB

Prints one tab-separated line:
    ok_rps get_rps post_rps responses ok non2xx errors deadline p50 p90 p99 p99.9 p99.99 statuses errs
where *_rps are 2xx responses per second (over DURATION_S), responses = every answered request,
errors = requests with no response other than those aborted at the -z deadline (counted apart in
`deadline`: the requests still in flight when oha stops, about one per connection), percentiles in
milliseconds over every answered request of both runs together (exact, from the databases; nearest
rank), statuses = "code:count,..." and errs = oha's error kinds other than the deadline.
Standard library only.
"""
import json
import math
import sqlite3
import sys

DEADLINE = "aborted due to deadline"


def load_json(path):
    with open(path) as f:
        return json.load(f)


def durations(path):
    try:
        con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error:
        return []
    try:
        return [r[0] for r in con.execute("SELECT duration FROM oha")]
    except sqlite3.Error:
        return []
    finally:
        con.close()


def pct(sorted_vals, p):
    if not sorted_vals:
        return float("nan")
    k = max(1, math.ceil(p / 100.0 * len(sorted_vals)))
    return sorted_vals[k - 1]


def main():
    if len(sys.argv) != 6:
        sys.exit("usage: mixed_stats.py DURATION_S GET_JSON POST_JSON GET_DB POST_DB")
    dur = float(sys.argv[1])
    runs = [load_json(sys.argv[2]), load_json(sys.argv[3])]
    ok_each, statuses, errs = [], {}, {}
    responses = ok = non2xx = errors = deadline = 0
    for r in runs:
        run_ok = 0
        for code, n in (r.get("statusCodeDistribution") or {}).items():
            statuses[code] = statuses.get(code, 0) + n
            responses += n
            if code.startswith("2"):
                run_ok += n
            else:
                non2xx += n
        ok += run_ok
        ok_each.append(run_ok)
        for kind, n in (r.get("errorDistribution") or {}).items():
            if kind == DEADLINE:
                deadline += n
            else:
                errors += n
                errs[kind] = errs.get(kind, 0) + n
    vals = sorted(durations(sys.argv[4]) + durations(sys.argv[5]))
    ms = [pct(vals, p) * 1000 for p in (50, 90, 99, 99.9, 99.99)]
    fields = [f"{ok / dur:.0f}", f"{ok_each[0] / dur:.0f}", f"{ok_each[1] / dur:.0f}", str(responses), str(ok),
              str(non2xx), str(errors), str(deadline)] + ["nan" if math.isnan(v) else f"{v:.3f}" for v in ms]
    fields.append(",".join(f"{k}:{v}" for k, v in sorted(statuses.items())) or "-")
    fields.append(",".join(f"{k.replace(chr(9), ' ')}:{v}" for k, v in sorted(errs.items())) or "-")
    print("\t".join(fields))


if __name__ == "__main__":
    main()
