#!/usr/bin/env python3
"""One database's trouble and another database's requests, for Scripts/bench isolation.

For each server URL given (sofa serve, then the live CouchDB): database A gets a
validate_doc_update that takes 1.5 s per write and 8 writers at once; meanwhile a bystander
reads a document, _changes and _all_docs of database B, one request every 0.1 s, each on a
new connection. Prints the bystander's latencies while idle and while A is busy (median,
95th percentile, slowest) as one JSON line per server.

With --memory PID (sofa serve only): a view emitting 5 MB per document over 20 documents in
database C, and the server's resident memory before, at its peak, and 5 s after the query.

usage: bench-isolation.py SERVER_URL USER PASSWORD [--memory PID]
"""
import base64
import http.client
import json
import statistics
import sys
import threading
import time
import urllib.parse

server, user, password = sys.argv[1], sys.argv[2], sys.argv[3]
memory_pid = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[4] == "--memory" else None
parts = urllib.parse.urlsplit(server)
auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
SLOW = "function(newDoc, oldDoc, userCtx, secObj) { var t = Date.now(); while (Date.now() - t < 1500) {} }"


def call(method, path, body=None, timeout=300):
    connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=timeout)
    headers = dict(auth)
    if body is not None:
        body = json.dumps(body)
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status >= 300 and not (method == "PUT" and response.status == 412):
        raise SystemExit(f"{method} {path}: {response.status} {data[:200]!r}")
    return data


def bystander(stop, latencies):
    targets = ["/bench-b/x", "/bench-b/_changes", "/bench-b/_all_docs"]
    i = 0
    while not stop.is_set():
        start = time.monotonic()
        call("GET", targets[i % 3])
        latencies.append(time.monotonic() - start)
        i += 1
        time.sleep(0.1)


def summary(latencies):
    ordered = sorted(latencies)
    return {"requests": len(ordered), "median_ms": round(statistics.median(ordered) * 1000, 1),
            "p95_ms": round(ordered[int(len(ordered) * 0.95) - 1] * 1000, 1), "slowest_ms": round(ordered[-1] * 1000, 1)}


def delete_quietly(name):
    try:
        call("DELETE", f"/{name}")
    except SystemExit:
        pass


for name in ["bench-a", "bench-b", "bench-c"]:
    delete_quietly(name)
for name in ["bench-a", "bench-b"]:
    call("PUT", f"/{name}")
call("PUT", "/bench-b/x", {"n": 1})
call("PUT", "/bench-a/_design/slow", {"validate_doc_update": SLOW})

idle = []
stop = threading.Event()
reader = threading.Thread(target=bystander, args=(stop, idle))
reader.start()
time.sleep(3)
stop.set()
reader.join()

busy = []
stop = threading.Event()
writers = [threading.Thread(target=call, args=("PUT", f"/bench-a/w{i}", {"i": i})) for i in range(8)]
started = time.monotonic()
for writer in writers:
    writer.start()
reader = threading.Thread(target=bystander, args=(stop, busy))
reader.start()
for writer in writers:
    writer.join()
writes = time.monotonic() - started
stop.set()
reader.join()
result = {"idle": summary(idle), "while_a_validates": summary(busy), "eight_writes_s": round(writes, 2)}


def rss(pid, field):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024


if memory_pid:
    call("PUT", "/bench-c")
    for i in range(20):
        call("PUT", f"/bench-c/d{i}", {"i": i})
    call("PUT", "/bench-c/_design/big", {"views": {"big": {"map": "function(doc) { emit(doc._id, new Array(5 * 1024 * 1024 + 1).join('x')); }"}}})
    before = rss(memory_pid, "VmRSS")
    try:
        call("GET", "/bench-c/_design/big/_view/big?limit=1")
        peak = rss(memory_pid, "VmHWM")
        time.sleep(5)
        after = rss(memory_pid, "VmRSS")
        result["large_view_rss_mb"] = {"before": round(before / 1e6), "peak": round(peak / 1e6), "5_s_after": round(after / 1e6)}
    except SystemExit as failure:
        result["large_view_rss_mb"] = {"failed": str(failure)}

for name in ["bench-a", "bench-b", "bench-c"]:
    delete_quietly(name)
print(json.dumps(result))
