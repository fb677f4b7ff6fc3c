#!/usr/bin/env python3
"""The relay loop's turns, from a `perf record` of its epoll_wait calls.

A turn is the time from one epoll_wait's return to the next call: the callbacks, timers and Swift job passes
libevent ran for what that wait returned. Record the relay (pid PID) with

    perf record -o loop.data -p PID -e raw_syscalls:sys_enter,raw_syscalls:sys_exit \
        --filter 'id == 232 || id == 281 || id == 441' -- sleep SECONDS

then `perf script -i loop.data | Benchmarks/loop-turns.py [MIN_MS]`. It prints how many turns passed 5, 10, 15,
20 and 50 ms, every turn over MIN_MS (default 15) with its time and how many events its wait returned, and the
turns' lengths by that number. With EVENT_PRECISE_TIMER=1 a turn woken only by a timer returns 1 event (the
timerfd), so a long turn with 1 event is a timer callback or the job pass it started, and a long turn with many
events is I/O callbacks that nothing bounds. Only the thread named pollcast-loop is read.
"""
import collections
import re
import sys

PATTERN = re.compile(
    r"^\s*(\S+)\s+(\d+)\s+\[\d+\]\s+([\d.]+):\s+raw_syscalls:sys_(enter|exit):\s+NR (\d+)(?:.*= (-?\d+))?")


def main():
    shown = float(sys.argv[1]) if len(sys.argv) > 1 else 15.0
    returned = {}
    turns = []
    for line in sys.stdin:
        match = PATTERN.match(line)
        if not match or match.group(1) != "pollcast-loop":
            continue
        _, thread, time, kind, _, result = match.groups()
        if kind == "exit":
            returned[thread] = (float(time), int(result) if result else -1)
        elif thread in returned:
            start, events = returned.pop(thread)
            turns.append((start, (float(time) - start) * 1000, events))
    if not turns:
        print("no turns of a thread named pollcast-loop")
        return
    first = turns[0][0]
    print(f"turns: {len(turns)} over {turns[-1][0] - first:.1f} s")
    for bound in (5, 10, 15, 20, 50):
        print(f"  over {bound} ms: {sum(1 for _, length, _ in turns if length > bound)}")
    print(f"turns over {shown:g} ms (s from the first turn, ms, events its wait returned):")
    for start, length, events in turns:
        if length > shown:
            print(f"  {start - first:8.2f} {length:8.2f} {events}")
    buckets = collections.defaultdict(list)
    for _, length, events in turns:
        buckets[max(events, 0).bit_length()].append(length)
    print("by events returned (fewer than): turns, mean ms, longest ms")
    for bucket in sorted(buckets):
        lengths = buckets[bucket]
        print(f"  {2 ** bucket:5d}: {len(lengths):7d} {sum(lengths) / len(lengths):8.3f} {max(lengths):8.2f}")


if __name__ == "__main__":
    main()
