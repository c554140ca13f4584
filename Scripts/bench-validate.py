#!/usr/bin/env python3
"""Writes with and without validate_doc_update, for Scripts/bench validate.

For each database URL given: N single PUTs on one keep-alive connection, then N documents
through _bulk_docs in batches of 1,000; first with no design document, then in a second
database with a validator that checks two fields (the common kind). Prints one JSON line
per server: documents per second for each, and the validator's cost as a ratio.

usage: bench-validate.py SERVER_URL USER PASSWORD DOCUMENTS
"""
import base64
import http.client
import json
import sys
import time
import urllib.parse
import uuid

server, user, password, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
parts = urllib.parse.urlsplit(server)
auth = {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}
VALIDATOR = """function(newDoc, oldDoc, userCtx, secObj) {
  if (newDoc._deleted) return;
  if (typeof newDoc.address !== 'string') throw({forbidden: 'Document must have an address.'});
  if (newDoc.owner && newDoc.owner !== userCtx.name && userCtx.roles.indexOf('_admin') === -1) throw({forbidden: 'not yours'});
}"""
connection = http.client.HTTPConnection(parts.hostname, parts.port, timeout=120)


def call(method, path, body=None):
    headers = dict(auth)
    if body is not None:
        body = json.dumps(body)
        headers["Content-Type"] = "application/json"
    connection.request(method, path, body=body, headers=headers)
    response = connection.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data)


def run(validated):
    db = "/bench-" + ("validated-" if validated else "plain-") + uuid.uuid4().hex[:8]
    call("PUT", db)
    if validated:
        call("PUT", db + "/_design/rules", {"validate_doc_update": VALIDATOR})
    started = time.monotonic()
    for n in range(count):
        call("PUT", f"{db}/single-{n}", {"address": f"street {n}", "n": n})
    single = count / (time.monotonic() - started)
    started = time.monotonic()
    for start in range(0, count, 1000):
        call("POST", db + "/_bulk_docs", {"docs": [{"_id": f"bulk-{n}", "address": f"street {n}", "n": n}
                                                   for n in range(start, min(count, start + 1000))]})
    bulk = count / (time.monotonic() - started)
    call("DELETE", db)
    return single, bulk


plain_single, plain_bulk = run(False)
checked_single, checked_bulk = run(True)
print(json.dumps({
    "single_put_per_s": {"plain": round(plain_single), "validated": round(checked_single),
                         "ratio": round(checked_single / plain_single, 2)},
    "bulk_docs_per_s": {"plain": round(plain_bulk), "validated": round(checked_bulk),
                        "ratio": round(checked_bulk / plain_bulk, 2)},
}))
