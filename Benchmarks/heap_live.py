#!/usr/bin/env python3
"""Live heap of a heaptrack recording at one moment, grouped by the first matching frame.

Usage: Benchmarks/heap_live.py RECORDING.zst AT_MS [FRAME ...]
       Benchmarks/heap_live.py --slabs RECORDING.zst AT_MS
       Benchmarks/heap_live.py --allocations RECORDING.zst FROM_MS AT_MS RATE [FRAME ...]

Replays heaptrack's own event stream (allocations, frees, traces; `zstd -dc`) up to AT_MS, then prints the bytes
still allocated, grouped by the first of FRAME (substrings of function names) found in each allocation's stack,
with the largest allocation sizes of each group ("4097B×2000": 2,000 live allocations of 4,097 bytes). Divide by
the number of accounts for a per-account figure. heaptrack's own peak report shows the connect storm; this shows
the steady state.

With --slabs, only Swift task-allocator slabs (each task keeps the slabs of the deepest chain of async frames it
ever needed), grouped by what opened each slab: the async function whose callee's frame did not fit in the slab
before, or the runtime's own record (`pushInitialTaskExecutorPreference`, `swift_continuation_await`).

With --allocations, the allocations made from FROM_MS to AT_MS (a window of the message phase, RATE messages a
second) per message, grouped by the first of FRAME found in each allocation's stack: what a message costs the
allocator, a count that does not move with the machine's noise.
"""
import collections
import subprocess
import sys


def main():
    slabs = sys.argv[1] == "--slabs"
    counting = sys.argv[1] == "--allocations"
    args = sys.argv[2:] if slabs or counting else sys.argv[1:]
    from_ms = float(args.pop(1)) if counting else 0
    path, at_ms = args[0], float(args[1])
    rate = float(args.pop(2)) if counting else 0
    keys = args[2:]
    strings, ips, traces, allocs = [None], [None], [None], []
    live = collections.Counter()
    made = collections.Counter()
    proc = subprocess.Popen(["zstd", "-dc", path], stdout=subprocess.PIPE, text=True)
    now = 0
    for line in proc.stdout:
        kind = line[0]
        if kind == "+":
            live[int(line[2:], 16)] += 1
            if counting and now >= from_ms:
                made[int(line[2:], 16)] += 1
        elif kind == "-":
            live[int(line[2:], 16)] -= 1
        elif kind == "a":
            _, size, trace = line.split()
            allocs.append((int(size, 16), int(trace, 16)))
        elif kind == "t":
            _, ip, parent = line.split()
            traces.append((int(ip, 16), int(parent, 16)))
        elif kind == "i":
            parts = line.split()
            ips.append(strings[int(parts[3], 16)] if len(parts) > 3 else parts[1])
        elif kind == "s":
            body = line[2:].strip()
            strings.append(body.split(" ", 1)[1] if " " in body else "")
        elif kind == "c":
            now = int(line[2:], 16)
            if now >= at_ms:
                break
    proc.kill()

    def frames(trace):
        found = []
        while trace and len(found) < 40:
            ip, parent = traces[trace]
            found.append(ips[ip] or "?")
            trace = parent
        return found

    if counting:
        messages = rate * (now - from_ms) / 1000
        groups = collections.Counter()
        for index, count in made.items():
            stack = frames(allocs[index][1])
            groups[next((key for key in keys if any(key in frame for frame in stack)), "other")] += count
        print(f"allocations from {from_ms:.0f} to {now} ms: {sum(made.values())}, "
              f"{sum(made.values()) / messages:.1f} per message ({messages:.0f} messages at {rate:g}/s)")
        for label, count in groups.most_common():
            print(f"{count / messages:8.1f}  {label}")
        return

    groups = collections.defaultdict(collections.Counter)
    total = 0
    for index, count in live.items():
        if count <= 0:
            continue
        size, trace = allocs[index]
        stack = frames(trace)
        total += size * count
        if slabs:
            label = slab_opener(stack)
            if label is None:
                continue
        else:
            label = next((key for key in keys if any(key in frame for frame in stack)), "other")
        groups[label][size] += count
    print(f"live at {now} ms: {total / 1e6:.2f} MB" + (" (all of the heap; slabs below)" if slabs else ""))
    ordered = sorted(groups.items(), key=lambda item: -sum(s * c for s, c in item[1].items()))
    names = demangled([label for label, _ in ordered]) if slabs else [label for label, _ in ordered]
    for (label, sizes), name in zip(ordered, names):
        held = sum(s * c for s, c in sizes.items())
        top = ", ".join(f"{s}B×{c}" for s, c in sorted(sizes.items(), key=lambda sc: -sc[0] * sc[1])[:5])
        print(f"{held / 1e6:8.2f} MB  {name[:160]}: {top}")


def slab_opener(stack):
    """The frame that opened a task-allocator slab, or None for any other allocation."""
    if not any("StackAllocator" in frame for frame in stack):
        return None
    callers = [i for i, frame in enumerate(stack) if "swift_task_alloc" in frame]
    at = callers[0] if callers else max(i for i, frame in enumerate(stack) if "StackAllocator" in frame)
    return stack[at + 1] if at + 1 < len(stack) else "?"


def demangled(labels):
    """Swift symbols readable (`swift demangle`), when the toolchain is there."""
    try:
        out = subprocess.run(
            ["swift", "demangle", "--simplified", "--compact"], input="\n".join(labels), capture_output=True,
            text=True, check=True).stdout.splitlines()
        return out if len(out) == len(labels) else labels
    except (OSError, subprocess.CalledProcessError):
        return labels


if __name__ == "__main__":
    main()
