#!/usr/bin/env python3
"""How fast a change travels, and how often idle processes wake, for Scripts/bench changes.

One database, mounted with --sync --continuous to a second database served by `sofa serve`
(the remote), and served by a second `sofa serve` of its own (another process writing it):
- another process's change visible in the mount: a PUT through the local server, then the
  time from its answer (the commit) until properties.json in the mount reads the new value;
- a save in the synced mount on the wire: the time from close() of a new properties.json
  until the remote's continuous _changes feed lists the document;
- another process's commit answered to a longpoll `_changes` on the local server;
- a `_replicator` document until its copy holds the source's documents;
- idle wake-ups: context switches per second of the mount and of each server over a quiet
  stretch (every thread's, from /proc/PID/task/*/status).
Prints one JSON object.

usage: bench-changes.py SOFA WORKDIR [ROUNDS]
"""
import glob
import http.client
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

sofa, work = sys.argv[1], sys.argv[2]
rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 30
processes = []


def start(*arguments, log):
    out = open(os.path.join(work, log), "w")
    process = subprocess.Popen([sofa, *arguments], stdout=out, stderr=subprocess.STDOUT)
    processes.append(process)
    return process


def serve(database, log, *extra):
    process = start("serve", database, "--port", "0", *extra, log=log)
    for _ in range(200):
        found = re.search(r"127\.0\.0\.1:(\d+)", open(os.path.join(work, log)).read())
        if found:
            return process, int(found.group(1))
        time.sleep(0.05)
    raise SystemExit(f"sofa serve {database} did not start")


def call(port, method, path, body=None):
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    connection.request(method, path, body=None if body is None else json.dumps(body),
                       headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    connection.close()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data)


def switches(pid):
    """Context switches so far, by thread."""
    counts = {}
    for status in glob.glob(f"/proc/{pid}/task/*/status"):
        try:
            counts[status] = sum(int(line.split()[1]) for line in open(status)
                                 if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")))
        except OSError:
            pass  # a thread that ended between the listing and the read
    return counts


def woken(before, after):
    """Switches between two counts: threads that ended meanwhile are not counted (a pool's
    idle threads end); threads that started count whole."""
    return sum(count - before.get(thread, 0) for thread, count in after.items())


def percentile(values, share):
    values = sorted(values)
    return values[min(len(values) - 1, int(len(values) * share))]


local, remote, mountpoint = (os.path.join(work, name) for name in ("local.sofa", "remote.sofa", "mnt"))
os.makedirs(mountpoint)
for database in (local, remote):
    subprocess.run([sofa, "create", database], check=True, capture_output=True)
result = {}
try:
    remote_server, remote_port = serve(remote, "remote.log")
    # By name: a server also serves the other databases of its database's folder (both are in work).
    remote_name = "remote"
    call(remote_port, "GET", f"/{remote_name}")
    local_server, local_port = serve(local, "local.log")
    local_name = "local"
    call(local_port, "GET", f"/{local_name}")
    mount = start("mount", "-f", local, mountpoint, "--remote", f"http://127.0.0.1:{remote_port}/{remote_name}",
                  "--sync", "--continuous", log="mount.log")
    for _ in range(200):
        if os.path.isdir(os.path.join(mountpoint, "docs")):
            break
        time.sleep(0.05)
    else:
        raise SystemExit("the mount did not come up")

    # Another process's change, seen in the mount.
    probe = os.path.join(mountpoint, "docs", "probe", "properties.json")
    revision = call(local_port, "PUT", f"/{local_name}/probe", {"n": -1})["rev"]
    while not os.path.exists(probe):
        time.sleep(0.001)
    foreign = []
    for n in range(rounds):
        json.load(open(probe))  # the kernel now holds it
        revision = call(local_port, "PUT", f"/{local_name}/probe", {"_rev": revision, "n": n})["rev"]
        committed = time.monotonic()
        while True:
            try:
                if json.load(open(probe)).get("n") == n:
                    break
            except (OSError, ValueError):
                pass  # replaced while read
        foreign.append((time.monotonic() - committed) * 1000)
        time.sleep(0.2)
    result["foreign_change_in_mount_ms"] = {"p50": round(percentile(foreign, 0.5), 2),
                                            "p90": round(percentile(foreign, 0.9), 2),
                                            "max": round(max(foreign), 2)}

    # A save in the synced mount, on the wire.
    arrived = {}
    since = call(remote_port, "GET", f"/{remote_name}")["update_seq"]
    feed = http.client.HTTPConnection("127.0.0.1", remote_port, timeout=120)
    feed.request("GET", f"/{remote_name}/_changes?feed=continuous&heartbeat=1000&since={since}")
    stream = feed.getresponse()

    def follow():
        try:
            for line in stream:
                line = line.strip()
                if line:
                    row = json.loads(line)
                    if "id" in row and row["id"] not in arrived:
                        arrived[row["id"]] = time.monotonic()
        except (OSError, ValueError, AttributeError):
            pass  # the feed is closed at the end

    threading.Thread(target=follow, daemon=True).start()
    time.sleep(0.5)
    wire = []
    for n in range(rounds):
        folder = os.path.join(mountpoint, "docs", f"wire-{n}")
        os.mkdir(folder)
        with open(os.path.join(folder, "properties.json"), "w") as file:
            file.write(json.dumps({"n": n}))
        closed = time.monotonic()
        deadline = closed + 30
        while f"wire-{n}" not in arrived and time.monotonic() < deadline:
            time.sleep(0.0005)
        if f"wire-{n}" not in arrived:
            raise SystemExit(f"wire-{n} never reached the remote")
        wire.append((arrived[f"wire-{n}"] - closed) * 1000)
        time.sleep(0.3)
    result["mount_save_on_the_wire_ms"] = {"p50": round(percentile(wire, 0.5), 2),
                                           "p90": round(percentile(wire, 0.9), 2),
                                           "max": round(max(wire), 2)}
    # Ended from this side, so that the server's feed ends too before the idle stretch.
    feed.sock.shutdown(socket.SHUT_RDWR)
    feed.close()

    # Another process's commit, answered to a longpoll on the local server.
    longpoll = []
    since = call(local_port, "GET", f"/{local_name}")["update_seq"]
    for n in range(rounds):
        waiting = http.client.HTTPConnection("127.0.0.1", local_port, timeout=60)
        waiting.request("GET", f"/{local_name}/_changes?feed=longpoll&since={since}&timeout=20000")
        time.sleep(0.1)  # the server waits now
        subprocess.run([sofa, "put", local, f"poll-{n}", json.dumps({"n": n})], check=True, capture_output=True)
        committed = time.monotonic()
        answer = json.loads(waiting.getresponse().read())
        longpoll.append((time.monotonic() - committed) * 1000)
        since = answer["last_seq"]
        waiting.close()
    result["foreign_change_to_longpoll_ms"] = {"p50": round(percentile(longpoll, 0.5), 2),
                                               "p90": round(percentile(longpoll, 0.9), 2),
                                               "max": round(max(longpoll), 2)}

    # A _replicator document, until its copy holds the source's document.
    jobs = os.path.join(work, "jobs")
    os.makedirs(jobs)
    jobs_server, jobs_port = serve(remote, "jobs.log", "--directory", jobs)
    call(jobs_port, "PUT", "/_replicator")
    jobs_latency = []
    for n in range(min(rounds, 10)):
        call(jobs_port, "PUT", f"/_replicator/job-{n}", {"source": remote_name, "target": f"copy-{n}", "create_target": True})
        made = time.monotonic()
        deadline = made + 60
        while time.monotonic() < deadline:
            try:
                if call(jobs_port, "GET", f"/copy-{n}")["doc_count"] > 0:
                    break
            except SystemExit:
                pass  # not made yet
            time.sleep(0.001)
        else:
            raise SystemExit(f"job-{n} never copied: {call(jobs_port, 'GET', f'/_replicator/job-{n}')}")
        jobs_latency.append((time.monotonic() - made) * 1000)
    result["replicator_document_to_copy_ms"] = {"p50": round(percentile(jobs_latency, 0.5), 2),
                                                "max": round(max(jobs_latency), 2)}
    jobs_server.terminate()

    # Idle: nothing happens for a while.
    time.sleep(3)
    pids = {"mount": mount.pid, "local_server": local_server.pid, "remote_server": remote_server.pid}
    before = {name: switches(pid) for name, pid in pids.items()}
    quiet = 20
    time.sleep(quiet)
    result["idle_wakeups_per_second"] = {name: round(woken(before[name], switches(pid)) / quiet, 2)
                                         for name, pid in pids.items()}
finally:
    subprocess.run(["fusermount3", "-u", mountpoint], capture_output=True)
    for process in reversed(processes):
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
print(json.dumps(result))
