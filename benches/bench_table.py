"""What the bench scripts share: their results file, one line per run
(`<system> <row> <a raftmq bench --json report, or the NATS publisher's>`),
and the table they print: per row and system, the median (min-max) of the
runs' msgs/s, p50 and p99, and the errors summed. Also the servers' CPU
per acknowledged message, from /proc, as the scripts call it:

    before=$(python3 benches/bench_table.py ticks PID...)
    ... run the load ...
    python3 benches/bench_table.py record SYSTEM ROW REPORT "$before" PID... >>results

which adds the largest heap of the processes after the run too.
"""
import json
import os
import statistics
import sys


def load(path):
    """{row: {system: [report, ...]}}"""
    rows = {}
    for line in open(path):
        system, row, report = line.split(" ", 2)
        rows.setdefault(row, {}).setdefault(system, []).append(json.loads(report))
    return rows


def median(reports, key):
    return statistics.median(r[key] for r in reports)


def cell(xs, fmt):
    xs = sorted(xs)
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(xs[0])}-{fmt.format(xs[-1])})"


def header(row_width):
    return f"{'row':<{row_width}} {'system':<7} {'msgs/s median (min-max)':<28} {'p50 ms':<22} {'p99 ms':<22} errors"


def line(row, system, reports, row_width):
    return (f"{row:<{row_width}} {system:<7} {cell([r['msgs_per_s'] for r in reports], '{:.0f}'):<28} "
            f"{cell([r['p50_ms'] for r in reports], '{:.2f}'):<22} "
            f"{cell([r['p99_ms'] for r in reports], '{:.2f}'):<22} {sum(r['errors'] for r in reports)}")


def first_errors(rows):
    """Each (row, system) whose runs had errors, with the first error one
    of them printed: a row of errors measures nothing, and must say why."""
    out = []
    for row, systems in rows.items():
        for system, reports in systems.items():
            errs = [r for r in reports if r.get("errors")]
            if errs:
                out.append(f"{row} {system}: {sum(r['errors'] for r in errs)} errors; "
                           f"first: {next((r.get('first_error') for r in errs if r.get('first_error')), '?')}")
    return out



def cpu_ticks(pids):
    """Each process's CPU time so far, user + system, in clock ticks."""
    out = []
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            # The command name (field 2) may hold spaces: count from after it.
            fields = f.read().rsplit(")", 1)[1].split()
        out.append(int(fields[11]) + int(fields[12]))
    return out


def with_cpu(report, before, after):
    """`report` with the CPU the servers spent per acknowledged message:
    all of them together (`cpu_us_per_msg`) and the busiest one, a group's
    leader (`busiest_us_per_msg`)."""
    used = [a - b for a, b in zip(after, before)]
    per = 1e6 / os.sysconf("SC_CLK_TCK") / max(report["ok"], 1)
    report["cpu_us_per_msg"] = sum(used) * per
    report["busiest_us_per_msg"] = max(used) * per
    return report


def largest_heap_mib(pids):
    """The largest heap (RssAnon, apart from mapped files) of the processes."""
    largest = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("RssAnon:"):
                    largest = max(largest, int(line.split()[1]))
    return largest / 1024


if __name__ == "__main__":
    if sys.argv[1] == "ticks":
        print(" ".join(map(str, cpu_ticks(sys.argv[2:]))))
    elif sys.argv[1] == "record":
        system, row, report, before, *pids = sys.argv[2:]
        report = with_cpu(json.loads(report), [int(t) for t in before.split()], cpu_ticks(pids))
        report["heap_mib"] = largest_heap_mib(pids)
        print(system, row, json.dumps(report))
    else:
        sys.exit(f"usage: {sys.argv[0]} ticks PID... | record SYSTEM ROW REPORT BEFORE PID...")
