#!/usr/bin/env python3
"""A patient SSE client for the Docker checks: reads URL for SECONDS, reconnecting with Last-Event-ID after every
end of stream (a killed node, a restart), and prints one JSON summary: the upstream ids it got per stream, the SSE
ids, resets and reconnections. Standard library only (it runs on the host, against published ports)."""
import http.client
import json
import sys
import time
import urllib.parse


def main():
    url, seconds = sys.argv[1], float(sys.argv[2])
    last_id = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else None
    parts = urllib.parse.urlsplit(url)
    deadline = time.monotonic() + seconds
    summary = {"messages": [], "sse_ids": [], "resets": 0, "connections": 0, "statuses": []}
    while time.monotonic() < deadline:
        headers = {"Accept": "text/event-stream"}
        if last_id:
            headers["Last-Event-ID"] = last_id
        try:
            conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=max(1.0, deadline - time.monotonic()))
            conn.request("GET", parts.path + ("?" + parts.query if parts.query else ""), headers=headers)
            response = conn.getresponse()
        except OSError:
            time.sleep(0.2)
            continue
        summary["statuses"].append(response.status)
        if response.status != 200:
            response.read()
            conn.close()
            time.sleep(0.3)
            continue
        summary["connections"] += 1
        event = {"type": "message", "data": [], "id": None}
        try:
            while time.monotonic() < deadline:
                line = response.fp.readline()
                if not line:
                    break
                line = line.decode("utf-8").rstrip("\n")
                if line == "":
                    if event["data"]:
                        if event["id"] is not None:
                            last_id = event["id"]
                        if event["type"] == "reset":
                            summary["resets"] += 1
                        elif event["type"] == "message":
                            body = json.loads("\n".join(event["data"]))
                            summary["messages"].append([body["stream"], int(body["upstream_id"])])
                            summary["sse_ids"].append(int(event["id"]))
                    event = {"type": "message", "data": [], "id": None}
                elif line.startswith(":"):
                    continue
                else:
                    field, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if field == "event":
                        event["type"] = value
                    elif field == "data":
                        event["data"].append(value)
                    elif field == "id":
                        event["id"] = value
        except (OSError, http.client.HTTPException, ValueError):
            pass
        conn.close()
    summary["last_id"] = last_id
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
