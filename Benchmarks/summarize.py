#!/usr/bin/env python3
"""Turns the SUMMARY lines of Benchmarks/compare-nchan.sh into one Markdown table of medians and ratios."""
import re
import statistics
import sys
from collections import defaultdict

runs = defaultdict(list)
for line in open(sys.argv[1]):
    fields = dict(re.findall(r"(\w+)=(\S+)", line))
    if "scenario" in fields and "target" in fields:
        runs[(fields["scenario"], fields["target"])].append(fields)


def median(scenario, target, key):
    values = []
    for fields in runs.get((scenario, target), []):
        try:
            value = float(fields[key])
        except (KeyError, ValueError):
            continue
        if value == value:  # not NaN
            values.append(value)
    return statistics.median(values) if values else None


def fmt(value, digits=2):
    return "–" if value is None else f"{value:,.{digits}f}"


def ratio(a, b):
    return "–" if a is None or b in (None, 0) else f"{a / b:.2f}"


metrics = [
    ("p50_ms", "latency p50 (ms)", 2),
    ("p99_ms", "latency p99 (ms)", 2),
    ("cpu_us_per_delivery", "relay CPU per delivery (µs)", 2),
    ("cpu_user_share", "… of which user space", 2),
    ("achieved_rate", "messages/s achieved by the injector", 1),
    ("deliveries_per_s", "deliveries/s", 0),
    ("lost", "lost", 0),
    ("not_injected", "messages never injected", 0),
    ("dup", "duplicated", 0),
    ("ooo", "out of order", 0),
    ("connect_s", "connect all (s)", 2),
    ("rss_kb_per_sub", "RSS per subscriber (KB)", 2),
    ("storm_recover_s", "storm: all resumed (s)", 3),
    ("idle_cpu_pct", "idle CPU (% of a core)", 3),
]
scenarios = []
for scenario, _ in runs:
    if scenario not in scenarios and not scenario.startswith("ramp-"):
        scenarios.append(scenario)

print("| scenario | metric | Pollcast | nchan | Pollcast / nchan | runs |")
print("| --- | --- | ---: | ---: | ---: | ---: |")
for scenario in scenarios:
    count = f"{len(runs.get((scenario, 'pollcast'), []))}/{len(runs.get((scenario, 'nchan'), []))}"
    for key, label, digits in metrics:
        p = median(scenario, "pollcast", key)
        n = median(scenario, "nchan", key)
        if p is None and n is None:
            continue
        print(f"| {scenario} | {label} | {fmt(p, digits)} | {fmt(n, digits)} | {ratio(p, n)} | {count} |")

ramp = defaultdict(dict)
for (scenario, target), entries in runs.items():
    match = re.match(r"ramp-1k-(\d+)", scenario)
    if match:
        ramp[target][int(match.group(1))] = entries[0]
print()
print("Highest sustainable deliveries/s, 1,000 subscribers: the best ramp step with no loss and p99 under 1 s")
print("(the injector offers the requested rate; what the server let through is the achieved rate):")
print()
print("| target | requested rate (ev/s) | achieved rate (ev/s) | deliveries/s | p99 (ms) | CPU per delivery (µs) |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for target in ("pollcast", "nchan"):
    best = None
    for rate in sorted(ramp.get(target, {})):
        fields = ramp[target][rate]
        try:
            ok = float(fields.get("lost", "1")) == 0 and float(fields.get("p99_ms", "1e9")) < 1000
            delivered = float(fields.get("deliveries_per_s", "0"))
        except ValueError:
            ok = False
        if ok and (best is None or delivered > float(best[1]["deliveries_per_s"])):
            best = (rate, fields)
    if best:
        rate, fields = best
        print(f"| {target} | {rate} | {float(fields.get('achieved_rate', 'nan')):,.1f} | "
              f"{float(fields['deliveries_per_s']):,.0f} | {float(fields['p99_ms']):,.1f} | "
              f"{float(fields.get('cpu_us_per_delivery', 'nan')):.2f} |")
    else:
        print(f"| {target} | – | – | – | – | – |")
