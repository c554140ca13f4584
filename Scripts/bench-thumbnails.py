#!/usr/bin/env python3
"""Bytes a deferred mount fetches while file managers show a folder of photos.

bench-thumbnails.py SOFA WORK [PHOTOS] [SECONDS]: PHOTOS random-pixel PNGs of about 20 MB
in one document of a served database (sofa serve), pulled with --no-download-attachments
through a proxy that counts the bytes the server sends, mounted, and shown by pcmanfm and
by Thunar (with tumblerd) under Xvfb, each with a fresh HOME (no thumbnail cache) for
SECONDS, with the mount's default thumbnail policy and with --thumbnail-fetch-max all.
"""
import os, shutil, signal, socket, struct, subprocess, sys, tempfile, threading, time, zlib

sofa, work = sys.argv[1], sys.argv[2]
photos = int(sys.argv[3]) if len(sys.argv) > 3 else 30
seconds = int(sys.argv[4]) if len(sys.argv) > 4 else 40


def png(path, w, h):
    raw = b''.join(b'\x00' + os.urandom(w * 3) for _ in range(h))
    def chunk(t, d): return struct.pack('>I', len(d)) + t + d + struct.pack('>I', zlib.crc32(t + d) & 0xffffffff)
    with open(path, 'wb') as f:
        f.write(b'\x89PNG\r\n\x1a\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', w, h, 8, 2, 0, 0, 0))
                + chunk(b'IDAT', zlib.compress(raw, 0)) + chunk(b'IEND', b''))


class CountingProxy:
    """Forwards 127.0.0.1:port to the server, counting what the server sends."""
    def __init__(self, upstream):
        self.sent, self.lock = 0, threading.Lock()
        self.listener = socket.socket()
        self.listener.bind(('127.0.0.1', 0))
        self.listener.listen(64)
        self.port, self.upstream = self.listener.getsockname()[1], upstream
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(('127.0.0.1', self.upstream))
            threading.Thread(target=self.pipe, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self.pipe, args=(server, client, True), daemon=True).start()

    def pipe(self, a, b, count):
        try:
            while True:
                data = a.recv(1 << 16)
                if not data:
                    break
                b.sendall(data)
                if count:
                    with self.lock:
                        self.sent += len(data)
        except OSError:
            pass
        finally:
            for s in (a, b):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass


def run(*args, **kw):
    return subprocess.run(args, check=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw).stdout


os.makedirs(work, exist_ok=True)
source = f'{work}/photos.sofa'
run(sofa, 'create', source)
total = 0
for i in range(photos):
    path = f'{work}/img{i:02d}.png'
    png(path, 2600 + 4 * i, 2600)
    total += os.path.getsize(path)
    run(sofa, 'attach', source, 'album', os.path.basename(path), path)
    os.unlink(path)
serve = subprocess.Popen([sofa, 'serve', source, '--port', '0'], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
port = int(serve.stdout.readline().rsplit(':', 1)[1].strip().strip('/'))
proxy = CountingProxy(port)
remote = f'http://127.0.0.1:{proxy.port}/photos'
xvfb = subprocess.Popen(['Xvfb', ':97', '-screen', '0', '1600x1000x24'], stderr=subprocess.DEVNULL)
time.sleep(1)

apps = {
    'pcmanfm': 'pcmanfm "$0" & sleep "$1"; kill $!',
    'thunar': '/usr/lib/x86_64-linux-gnu/tumbler-1/tumblerd & sleep 0.5; thunar "$0" & sleep "$1"; pkill -x thunar; pkill -x tumblerd',
}
print(f'{photos} PNGs of about 20 MB ({total / 1e6:.0f} MB) in one document, deferred; '
      f'each file manager shows its attachments/ folder for {seconds} s under Xvfb, no thumbnail cache')
print(f'| file manager | policy | bytes the server sent | of the bodies | thumbnails drawn |')
print(f'|---|---|---|---|---|')
try:
    for app, script in apps.items():
        for policy, arguments in (('default (thumbnails fetch ≤ 1 MiB)', []), ('--thumbnail-fetch-max all', ['--thumbnail-fetch-max', 'all'])):
            target, mnt = f'{work}/deferred.sofa', f'{work}/mnt'
            shutil.rmtree(target, ignore_errors=True)
            os.makedirs(mnt, exist_ok=True)
            run(sofa, 'create', target)
            run(sofa, 'pull', target, remote, '--no-download-attachments')
            run(sofa, 'mount', target, mnt, '--remote', remote, *arguments)
            home = tempfile.mkdtemp(dir=work)
            before = proxy.sent
            env = dict(os.environ, HOME=home, DISPLAY=':97')
            subprocess.run(['dbus-run-session', '--', 'sh', '-c', script, f'{mnt}/docs/album/attachments', str(seconds)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            sent = proxy.sent - before
            drawn = sum(len(files) for _, _, files in os.walk(f'{home}/.cache/thumbnails'))
            print(f'| {app} | {policy} | {sent:,} | {100 * sent / total:.1f} % | {drawn} |', flush=True)
            subprocess.run(['fusermount3', '-u', mnt])
            shutil.rmtree(home, ignore_errors=True)
    # A viewer (anything that is not a thumbnailer) gets the whole body, with the default policy.
    shutil.rmtree(target, ignore_errors=True)
    run(sofa, 'create', target)
    run(sofa, 'pull', target, remote, '--no-download-attachments')
    run(sofa, 'mount', target, mnt, '--remote', remote)
    before = proxy.sent
    with open(f'{mnt}/docs/album/attachments/img00.png', 'rb') as f:
        length = sum(len(chunk) for chunk in iter(lambda: f.read(1 << 20), b''))
    print(f'opened by a reader that is not a thumbnailer (a viewer, cat): {length:,} bytes read, {proxy.sent - before:,} sent')
    subprocess.run(['fusermount3', '-u', mnt])
finally:
    serve.terminate()
    xvfb.terminate()
