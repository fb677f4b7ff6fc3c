"""How long the relay's loop is held, as a client sees it: /healthz answers timed back to back (keep-alive) while
/metrics is scraped every 0.5 s on another connection. Prints the scrapes' own times and /healthz p50/p99/p99.9/max.
Usage: python3 Benchmarks/stallprobe.py PORT SECONDS (run it on the other core: taskset -c 1)."""
import http.client, sys, threading, time, statistics
port, seconds = int(sys.argv[1]), float(sys.argv[2])
scrapes, health = [], []
stop = time.monotonic() + seconds
def scraper():
    while time.monotonic() < stop:
        t = time.monotonic()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        c.request("GET", "/metrics"); r = c.getresponse(); body = r.read(); c.close()
        scrapes.append(time.monotonic() - t)
        time.sleep(0.5)
threading.Thread(target=scraper, daemon=True).start()
c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
while time.monotonic() < stop:
    t = time.monotonic()
    c.request("GET", "/healthz"); r = c.getresponse(); r.read()
    health.append(time.monotonic() - t)
    if r.getheader("Connection", "").lower() == "close":
        c.close(); c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    time.sleep(0.002)
health.sort()
print(f"scrapes {len(scrapes)}: median {statistics.median(scrapes)*1000:.1f} ms, max {max(scrapes)*1000:.1f} ms; "
      f"/healthz {len(health)}: p50 {health[len(health)//2]*1000:.2f} ms, p99 {health[int(len(health)*0.99)]*1000:.2f} ms, "
      f"p99.9 {health[int(len(health)*0.999)]*1000:.2f} ms, max {health[-1]*1000:.1f} ms")
