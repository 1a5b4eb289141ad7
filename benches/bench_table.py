"""What the bench scripts share: their results file, one line per run
(`<system> <row> <a raftmq bench --json report, or the NATS publisher's>`),
and the table they print: per row and system, the median (min-max) of the
runs' msgs/s, p50 and p99, and the errors summed."""
import json
import statistics


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

