#!/usr/bin/env python3
"""Scripts/bench cblite2: a Couchbase Lite database (.cblite2) beside the same documents in a
Sofa database: copied each way, mounted, listed, searched and read through the mount.

N documents (default 10,000), one in ten with a 20 KB blob. Each mount job runs three times,
the two mounts alternating, medians; ratios are the Sofa mount's time / the .cblite2 mount's
(1.00x: as fast; the goal is >= 0.8x). Needs root (FUSE) and a release build
(Scripts/bench builds one)."""
import base64, hashlib, json, os, statistics, subprocess, sys, tempfile, time

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sofa = os.path.join(root, ".build/release/sofa")
cblite = os.path.join(root, "../shared/peers/cblite")
documents = int(sys.argv[sys.argv.index("--documents") + 1]) if "--documents" in sys.argv else 10_000
base = sys.argv[sys.argv.index("--dir") + 1] if "--dir" in sys.argv else None
work = tempfile.mkdtemp(prefix="sofa-bench-cblite2-", dir=base)
env = dict(os.environ, XDG_CACHE_HOME=os.path.join(work, "cache"))


def run(*arguments, **options):
    return subprocess.run(arguments, check=True, capture_output=True, text=True, env=env, **options)


def timed(*arguments):
    start = time.monotonic()
    run(*arguments)
    return time.monotonic() - start


def shell(command):
    start = time.monotonic()
    subprocess.run(command, shell=True, check=True, stdout=subprocess.DEVNULL, env=env)
    return time.monotonic() - start


def peak_rss(pid):
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def mount(database, point):
    os.makedirs(point, exist_ok=True)
    start = time.monotonic()
    process = subprocess.Popen([sofa, "mount", database, point, "--foreground"], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while subprocess.run(["mountpoint", "-q", point]).returncode != 0:
        if process.poll() is not None:
            sys.exit(f"sofa mount {database} failed")
        time.sleep(0.01)
    return process, time.monotonic() - start


def unmount(process, point):
    subprocess.run(["fusermount3", "-u", point], check=True)
    process.wait()


print(f"# {documents} documents, one in ten with a 20 KB blob; in {work}")
lines = []
for index in range(documents):
    document = {"_id": f"doc-{index:06d}", "index": index, "title": f"Document {index}", "tags": ["a", "b", str(index % 7)]}
    if index % 10 == 0:
        body = os.urandom(20_000)
        digest = "sha1-" + base64.b64encode(hashlib.sha1(body).digest()).decode()
        document["photo"] = {"@type": "blob", "content_type": "image/jpeg", "digest": digest, "length": len(body)}
        document["_attachments"] = {"blob_/photo": {"content_type": "image/jpeg", "data": base64.b64encode(body).decode()}}
    lines.append(json.dumps(document))
with open(os.path.join(work, "docs.jsonl"), "w") as out:
    out.write("\n".join(lines) + "\n")
reference = os.path.join(work, "reference.sofa")
app = os.path.join(work, "app.cblite2")
run(sofa, "cp", os.path.join(work, "docs.jsonl"), reference)
rows = [("sofa cp X.sofa NEW.cblite2", timed(sofa, "cp", reference, app))]
check = run(cblite, "check", app).stdout
assert "everything looks OK" in check, check
rows.append(("sofa cp APP.cblite2 NEW.sofa", timed(sofa, "cp", app, os.path.join(work, "back.sofa"))))
for label, seconds in rows:
    print(f"{label:40s} {seconds:7.2f} s")

plain_point, lite_point = os.path.join(work, "m-sofa"), os.path.join(work, "m-cblite2")
plain, plain_first = mount(reference, plain_point)
lite, lite_first = mount(app, lite_point)
print(f"{'first mount (the .cblite2: its companion made)':40s} sofa {plain_first:6.2f} s   cblite2 {lite_first:6.2f} s")
unmount(lite, lite_point)
lite, lite_again = mount(app, lite_point)
print(f"{'mount again (companion up to date)':40s} sofa {plain_first:6.2f} s   cblite2 {lite_again:6.2f} s")

jobs = [
    ("ls -lR docs", "ls -lR {}/docs"),
    ("find docs -type f", "find {}/docs -type f"),
    ("cat every blob", "find {}/docs -path '*/blobs/*' -type f -exec cat {{}} +"),
    ("cat every properties.json", "find {}/docs -name properties.json -exec cat {{}} +"),
]
print(f"{'job (warm, median of 3)':40s} {'sofa':>8s} {'cblite2':>8s} {'ratio':>7s}")
for label, command in jobs:
    ours, theirs = [], []
    for _ in range(3):
        ours.append(shell(command.format(plain_point) + " > /dev/null"))
        theirs.append(shell(command.format(lite_point) + " > /dev/null"))
    a, b = statistics.median(ours), statistics.median(theirs)
    print(f"{label:40s} {a:7.2f}s {b:7.2f}s {a / b:6.2f}x")

# An edit through the mount reaching the file, and one LiteCore makes reaching the mount.
target = os.path.join(lite_point, "docs/doc-000001/properties.json")
start = time.monotonic()
with open(target, "w") as out:
    out.write('{"edited": "in the mount"}')
while '"in the mount"' not in run(cblite, "cat", app, "doc-000001").stdout:
    time.sleep(0.01)
print(f"{'a save in the mount seen by cblite cat':40s} {time.monotonic() - start:7.2f} s")
start = time.monotonic()
run(cblite, "--writeable", "put", app, "doc-000002", '{"edited": "by LiteCore"}')
while "by LiteCore" not in open(os.path.join(lite_point, "docs/doc-000002/properties.json")).read():
    time.sleep(0.01)
print(f"{'cblite put seen in the mount':40s} {time.monotonic() - start:7.2f} s")
print(f"{'peak RSS of the mount':40s} sofa {peak_rss(plain.pid) / 2**20:6.1f} MB   cblite2 {peak_rss(lite.pid) / 2**20:6.1f} MB")
unmount(plain, plain_point)
unmount(lite, lite_point)
assert "everything looks OK" in run(cblite, "check", app).stdout
subprocess.run(["rm", "-rf", work])
