#!/usr/bin/env python3
"""50 concurrent clients against a CouchDB-compatible server, for Scripts/bench clients.

Each client keeps one HTTP/1.1 connection and, for the duration, picks at random:
  45 %  GET a document
  25 %  update a document: GET it, PUT it with its _rev and its counter + 1, retrying on 409
  15 %  GET an attachment (64 KiB)
  15 %  _changes?feed=longpoll&since=now&timeout=1000
Prints one JSON line: requests/s, p50/p99 latency per kind, errors, and whether every
successful update is in the documents (no lost update: each document's counter equals the
number of updates clients saw succeed on it).

usage: bench-clients.py URL_OF_DATABASE USER PASSWORD SECONDS CLIENTS
"""
import base64
import http.client
import json
import random
import sys
import threading
import time
import urllib.parse

url, user, password, seconds, clients = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]), int(sys.argv[5])
parts = urllib.parse.urlsplit(url)
host, port, db = parts.hostname, parts.port, parts.path.rstrip("/")
auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()} if user else {}
DOCS = 200


def connect():
    return http.client.HTTPConnection(host, port, timeout=60)


def call(connection, method, path, body=None, headers=None):
    all_headers = dict(auth)
    if body is not None:
        body = json.dumps(body)
        all_headers["Content-Type"] = "application/json"
    all_headers.update(headers or {})
    connection.request(method, path, body=body, headers=all_headers)
    response = connection.getresponse()
    data = response.read()
    return response.status, data


def setup():
    connection = connect()
    call(connection, "DELETE", db)
    status, _ = call(connection, "PUT", db)
    assert status in (201, 202), f"cannot create {db}: {status}"
    docs = [{"_id": f"doc-{i:04d}", "counter": 0, "title": f"Document {i}"} for i in range(DOCS)]
    status, _ = call(connection, "POST", db + "/_bulk_docs", {"docs": docs})
    assert status == 201, status
    blob = bytes(random.getrandbits(8) for _ in range(65536))
    status, data = call(connection, "GET", db + "/doc-0000")
    rev = json.loads(data)["_rev"]
    connection.request("PUT", f"{db}/doc-0000/blob.bin?rev={rev}", body=blob,
                       headers=dict(auth, **{"Content-Type": "application/octet-stream"}))
    response = connection.getresponse()
    response.read()
    assert response.status == 201, response.status
    return blob


def client(seed, deadline, stats, blob):
    rng = random.Random(seed)
    connection = connect()
    mine = {"latency": {"read": [], "update": [], "attachment": [], "changes": []}, "errors": 0, "updates": {}, "conflicts": 0}
    while time.monotonic() < deadline:
        kind = rng.choices(["read", "update", "attachment", "changes"], [45, 25, 15, 15])[0]
        started = time.monotonic()
        try:
            if kind == "read":
                status, _ = call(connection, "GET", f"{db}/doc-{rng.randrange(1, DOCS):04d}")
                ok = status == 200
            elif kind == "attachment":
                status, data = call(connection, "GET", f"{db}/doc-0000/blob.bin")
                ok = status == 200 and data == blob
            elif kind == "changes":
                status, _ = call(connection, "GET", f"{db}/_changes?feed=longpoll&since=now&timeout=1000")
                ok = status == 200
            else:
                doc_id = f"doc-{rng.randrange(1, DOCS):04d}"
                while True:
                    status, data = call(connection, "GET", f"{db}/{doc_id}")
                    if status != 200:
                        ok = False
                        break
                    doc = json.loads(data)
                    doc["counter"] += 1
                    status, _ = call(connection, "PUT", f"{db}/{doc_id}", doc)
                    if status == 409:
                        mine["conflicts"] += 1
                        continue
                    ok = status == 201
                    if ok:
                        mine["updates"][doc_id] = mine["updates"].get(doc_id, 0) + 1
                    break
        except Exception:
            ok = False
            connection.close()
            connection = connect()
        if ok:
            mine["latency"][kind].append(time.monotonic() - started)
        else:
            mine["errors"] += 1
    stats.append(mine)


def main():
    blob = setup()
    stats = []
    deadline = time.monotonic() + seconds
    threads = [threading.Thread(target=client, args=(n, deadline, stats, blob)) for n in range(clients)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.monotonic() - started
    # No lost update: every counter is the number of updates clients saw succeed on it.
    expected = {}
    for mine in stats:
        for doc_id, count in mine["updates"].items():
            expected[doc_id] = expected.get(doc_id, 0) + count
    connection = connect()
    status, data = call(connection, "GET", f"{db}/_all_docs?include_docs=true")
    rows = json.loads(data)["rows"]
    lost = sum(1 for row in rows if row["id"] in expected and row["doc"]["counter"] != expected[row["id"]])
    result = {"requests": 0, "errors": sum(m["errors"] for m in stats), "conflicts_retried": sum(m["conflicts"] for m in stats),
              "lost_updates": lost, "seconds": round(elapsed, 1)}
    for kind in ["read", "update", "attachment", "changes"]:
        latencies = sorted(l for m in stats for l in m["latency"][kind])
        result["requests"] += len(latencies)
        if latencies:
            result[kind] = {"count": len(latencies), "p50_ms": round(latencies[len(latencies) // 2] * 1000, 2),
                            "p99_ms": round(latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))] * 1000, 2)}
    result["requests_per_second"] = round(result["requests"] / elapsed, 1)
    call(connection, "DELETE", db)
    print(json.dumps(result))


main()
