#!/usr/bin/env python3
"""A database of N documents (one in ten with a 1 KiB attachment) imported, mounted and
listed, and with a CouchDB (COUCHDB_URL set, admin/secret) pushed to it and pulled back into
a new database: the time of each step and the peak resident memory of the process doing it.

usage: bench-scale.py SOFA WORK DOCUMENTS [--no-mount]
"""
import base64
import json
import os
import random
import subprocess
import sys
import time

sofa, work, documents = sys.argv[1], sys.argv[2], int(sys.argv[3])
mounting = "--no-mount" not in sys.argv[4:]
couchdb = os.environ.get("COUCHDB_URL")
database, mountpoint, lines = f"{work}/scale.sofa", f"{work}/mnt", f"{work}/documents.jsonl"
rows = []


def row(job, seconds, rss_kib, note=""):
    rows.append((job, seconds, rss_kib, note))
    print(f"{job:<52} {seconds:8.2f} s  peak RSS {rss_kib / 1024:6.1f} MB  {note}", flush=True)


def peak_kib(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return 0


def timed(command):
    start = time.monotonic()
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - start


random.seed(1)
with open(lines, "w") as out:
    for index in range(documents):
        document = {"_id": "%032x" % random.getrandbits(128), "n": index, "name": f"item {index}", "tags": ["a", "b"]}
        if index % 10 == 0:
            document["_attachments"] = {"a.bin": {"content_type": "application/octet-stream",
                                                  "data": base64.b64encode(random.randbytes(1024)).decode()}}
        out.write(json.dumps(document) + "\n")
attachments = (documents + 9) // 10
print(f"{documents} documents, {attachments} with a 1 KiB attachment, in {work}", flush=True)

subprocess.run([sofa, "create", database], check=True, stdout=subprocess.DEVNULL)
start = time.monotonic()
imported = subprocess.run(["/usr/bin/time", "-f", "%M", sofa, "import", database, lines],
                          check=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
row(f"sofa import of {documents} documents", time.monotonic() - start, int(imported.stderr.strip().split("\n")[-1]))



def measured(arguments):
    """Runs a sofa command under GNU time: its seconds and peak RSS in KiB."""
    start = time.monotonic()
    done = subprocess.run(["/usr/bin/time", "-f", "%M"] + arguments, check=True, stdout=subprocess.DEVNULL,
                          stderr=subprocess.PIPE, text=True)
    return time.monotonic() - start, int(done.stderr.strip().split("\n")[-1])


if couchdb:
    # As CouchDB's own tools would: over 127.0.0.1 with the admin's session (which ends
    # after 10 minutes: a run past that logs in again).
    remote = couchdb.replace("http://", "http://admin:secret@") + f"/scale-{os.getpid()}"
    seconds, rss = measured([sofa, "push", database, remote, "--create-target"])
    row(f"sofa push of {documents} documents to CouchDB", seconds, rss, "into a new database")
    seconds, rss = measured([sofa, "cp", remote, f"{work}/pulled.sofa"])
    row(f"sofa pull of them back (sofa cp URL DB)", seconds, rss, "into a new database")
    subprocess.run([sofa, "check", f"{work}/pulled.sofa"], check=True, stdout=subprocess.DEVNULL)
    listed = subprocess.run([sofa, "info", f"{work}/pulled.sofa", "--json"], check=True, capture_output=True, text=True)
    count = json.loads(listed.stdout).get("documents")
    print(f"pulled database: {count} documents, sofa check clean", flush=True)
    if count != documents:
        sys.exit(f"the pull brought {count} documents, not {documents}")
    subprocess.run(["curl", "-sf", "-X", "DELETE", remote], stdout=subprocess.DEVNULL)
    subprocess.run(["rm", "-rf", f"{work}/pulled.sofa"])

if not mounting:
    sys.exit(0)
os.makedirs(mountpoint, exist_ok=True)
mount = subprocess.Popen([sofa, "mount", database, mountpoint, "--foreground"], stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 30
while not os.path.ismount(mountpoint):
    if time.monotonic() > deadline or mount.poll() is not None:
        sys.exit("the mount did not come up")
    time.sleep(0.05)
try:
    seconds = timed(f"ls {mountpoint}/docs | wc -l")
    row(f"ls docs/ ({documents} names)", seconds, peak_kib(mount.pid), "mount process")
    seconds = timed(f"ls -l {mountpoint}/docs | wc -l")
    row("ls -l docs/ after it (a lookup per name)", seconds, peak_kib(mount.pid), "mount process")
    seconds = timed(f"find {mountpoint}/docs -maxdepth 2 | wc -l")
    row(f"find docs/ -maxdepth 2 ({3 * documents} names)", seconds, peak_kib(mount.pid), "mount process")
    seconds = timed(f"find {mountpoint}/docs -mindepth 3 -maxdepth 3 -name a.bin | wc -l")
    row(f"find the {attachments} attachments (every attachments/)", seconds, peak_kib(mount.pid), "mount process")
    with open(f"{mountpoint}/.sofa/status.json") as status:
        kept = json.load(status)["fuse"]["kept_nodes"]
    print(f"nodes the mount keeps for the kernel after all that: {kept}")
finally:
    subprocess.run(["fusermount3", "-u", mountpoint])
    mount.wait()
