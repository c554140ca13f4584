#!/usr/bin/env python3
"""Scripts/bench couchdb --cluster [DOCUMENTS] [ROUNDS]

Sofa's replicator against a real CouchDB 3.4.3 cluster of three nodes on loopback (q=8, n=3,
../shared/peers/couchdb cluster), beside CouchDB's own replicator doing the same copy between
the cluster and a single CouchDB node, in interleaved rounds (these machines are shared and
noisy: ratios within one round mean more than times across runs).

  push: `sofa push DATASET.sofa CLUSTER/db`   beside   the single node's _replicate SINGLE/src -> CLUSTER/db
  pull: `sofa pull NEW.sofa CLUSTER/src`      beside   the single node's _replicate CLUSTER/src -> SINGLE/db

The dataset: DOCUMENTS small documents (default 20,000), one in forty with a 20 KB attachment.
Ratios are CouchDB's time / Sofa's (Sofa's throughput as a fraction of the reference's).
Needs a release build (Scripts/bench builds it).
"""
import base64, json, os, shutil, statistics, subprocess, sys, tempfile, time, urllib.request

sofa = os.path.abspath('.build/release/sofa')
peers = os.path.abspath('../shared/peers/couchdb')
documents = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
work = tempfile.mkdtemp(prefix='sofa-bench-cluster-', dir=os.environ.get('SOFA_BENCH_DIR', '/var/tmp'))
auth = 'admin:secret'


def with_auth(base, db):
    return base.replace('http://', f'http://{auth}@') + '/' + db


def request(method, url, body=None):
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers={
        'Content-Type': 'application/json',
        'Authorization': 'Basic ' + base64.b64encode(auth.encode()).decode()})
    with urllib.request.urlopen(req, timeout=3600) as answer:
        return json.loads(answer.read() or b'null')


def timed(args):
    started = time.monotonic()
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return time.monotonic() - started


def replicate(node, source, target):
    started = time.monotonic()
    answer = request('POST', node + '/_replicate', {'source': source, 'target': target, 'create_target': True})
    assert answer.get('ok'), answer
    return time.monotonic() - started


cluster = single = None
try:
    cluster = subprocess.check_output([peers, 'cluster', work + '/cluster', '3'], text=True).split()
    single = subprocess.check_output([peers, 'start', work + '/single'], text=True).strip()
    print(f'cluster {" ".join(cluster)} (q=8, n=3); single node {single}; {documents:,} documents, '
          f'{documents // 40:,} with 20 KB attachments; {rounds} rounds; in {work}')

    # The dataset, as JSON lines imported into a Sofa database, then loaded into both CouchDBs.
    lines = work + '/dataset.jsonl'
    with open(lines, 'w') as out:
        for n in range(documents):
            doc = {'_id': f'doc-{n:06d}', 'n': n, 'text': 'a document of the cluster benchmark'}
            if n % 40 == 0:
                doc['_attachments'] = {'photo.bin': {'content_type': 'application/octet-stream',
                                                     'data': base64.b64encode(os.urandom(20_000)).decode()}}
            out.write(json.dumps(doc) + '\n')
    dataset = work + '/dataset.sofa'
    subprocess.run([sofa, 'create', dataset], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sofa, 'import', dataset, lines], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sofa, 'push', dataset, with_auth(cluster[0], 'src'), '--create-target'], check=True, stdout=subprocess.DEVNULL)
    subprocess.run([sofa, 'push', dataset, with_auth(single, 'src'), '--create-target'], check=True, stdout=subprocess.DEVNULL)

    rows = {'push': ([], []), 'pull': ([], [])}
    for r in range(rounds):
        sofa_push = timed([sofa, 'push', dataset, with_auth(cluster[0], f'spush-{r}'), '--create-target'])
        couch_push = replicate(single, with_auth(single, 'src'), with_auth(cluster[0], f'cpush-{r}'))
        subprocess.run([sofa, 'create', f'{work}/pull-{r}.sofa'], check=True, stdout=subprocess.DEVNULL)
        sofa_pull = timed([sofa, 'pull', f'{work}/pull-{r}.sofa', with_auth(cluster[0], 'src')])
        couch_pull = replicate(single, with_auth(cluster[0], 'src'), with_auth(single, f'cpull-{r}'))
        rows['push'][0].append(sofa_push); rows['push'][1].append(couch_push)
        rows['pull'][0].append(sofa_pull); rows['pull'][1].append(couch_pull)
        print(f'round {r + 1}: push sofa {sofa_push:.1f} s, CouchDB {couch_push:.1f} s ({couch_push / sofa_push:.2f}x); '
              f'pull sofa {sofa_pull:.1f} s, CouchDB {couch_pull:.1f} s ({couch_pull / sofa_pull:.2f}x)', flush=True)
        for db in (f'spush-{r}', f'cpush-{r}'):
            request('DELETE', cluster[0] + '/' + db)
        request('DELETE', single + f'/cpull-{r}')

    print('-' * 100)
    for job, (ours, theirs) in rows.items():
        ratios = [t / o for o, t in zip(ours, theirs)]
        print(f'{job}: sofa median {statistics.median(ours):.1f} s, CouchDB\'s replicator {statistics.median(theirs):.1f} s; '
              f'ratio per round {", ".join(f"{x:.2f}x" for x in ratios)}')
finally:
    if cluster is not None:
        subprocess.run([peers, 'stop', work + '/cluster'])
    if single is not None:
        subprocess.run([peers, 'stop', work + '/single'])
    shutil.rmtree(work, ignore_errors=True)
