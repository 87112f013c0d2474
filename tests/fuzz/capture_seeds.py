"""Records real traffic as the fuzz targets' seeds (tests/fuzz/corpus/<target>/).

    python3 tests/fuzz/capture_seeds.py BUILD_DIR PYTHON...

frames: the bytes a real mcprun agent sends rendezvousd in a 1-node job, and the daemon's
answers, through a recording proxy. store_protocol: the bytes each PYTHON's torch TCPStore client
sends `mcprun store` (torch 1.13 speaks the 1.x dialect, 2.13 the 2.x one). Each seed starts with
the bytes the target reads as its mode and split size."""
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading

BUILD = sys.argv[1]
PYTHONS = sys.argv[2:]
CORPUS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")


class RecordingProxy:
    """Forwards one port to `target`, keeping each direction's bytes per connection."""

    def __init__(self, target):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.streams = []  # [(client bytes, server bytes)]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            client, _ = self.listener.accept()
            server = socket.create_connection(self.target)
            record = [bytearray(), bytearray()]
            self.streams.append(record)
            for source, sink, kept in ((client, server, record[0]), (server, client, record[1])):
                threading.Thread(target=self.pump, args=(source, sink, kept), daemon=True).start()

    @staticmethod
    def pump(source, sink, kept):
        while True:
            try:
                data = source.recv(65536)
            except OSError:
                data = b""
            if not data:
                try:
                    sink.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            kept += data
            sink.sendall(data)


def started(command, pattern):
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for line in proc.stdout:
        found = re.search(pattern, line)
        if found:
            return proc, int(found.group(1))
    raise SystemExit(f"{command[0]} did not start")


def save(target, name, data):
    os.makedirs(os.path.join(CORPUS, target), exist_ok=True)
    with open(os.path.join(CORPUS, target, name), "wb") as out:
        out.write(data)


def capture_agent():
    daemon, port = started([f"{BUILD}/rendezvousd/rendezvousd", "--listen", "127.0.0.1:0"],
                           r"listening on 127\.0\.0\.1:(\d+)")
    proxy = RecordingProxy(("127.0.0.1", port))
    with tempfile.TemporaryDirectory() as tmp:
        worker = os.path.join(tmp, "worker.py")
        with open(worker, "w") as out:
            out.write("import mcprun\nmcprun.heartbeat()\nmcprun.barrier('seed', 30)\n")
        agents = [subprocess.Popen([f"{BUILD}/launcher/mcprun", "--nnodes", "2", "-n", "1",
                                    "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{proxy.port}",
                                    "--rdzv-id", "seed", "--node-name", f"n{i}", worker],
                                   env=dict(os.environ, PYTHON_EXEC="/usr/bin/python3"))
                  for i in range(2)]
        if any(agent.wait(timeout=60) != 0 for agent in agents):
            raise SystemExit("the seed job failed")
    daemon.terminate()
    daemon.wait()
    for index, (sent, answered) in enumerate(proxy.streams):
        save("frames", f"agent-{index}", b"\x00\x07\x00" + bytes(sent))
        save("frames", f"daemon-{index}", b"\x00\x03\x00" + bytes(answered))


STORE_CLIENT = r'''
import sys
from datetime import timedelta
import torch.distributed as dist
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, False, timedelta(seconds=10))
store.set("key", "value")
store.get("key")
store.add("counter", 3)
store.compare_set("key", "value", "other")
store.wait(["key", "counter"])
store.num_keys()
store.delete_key("counter")
'''


def capture_store(python):
    server, port = started([f"{BUILD}/launcher/mcprun", "store", "--host", "127.0.0.1", "--port", "0"],
                           r"listening on .*:(\d+)")
    proxy = RecordingProxy(("127.0.0.1", port))
    version = subprocess.run([python, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    subprocess.run([python, "-c", STORE_CLIENT, str(proxy.port)], check=True, timeout=60)
    server.terminate()
    server.wait()
    for index, (sent, _) in enumerate(proxy.streams):
        if not sent:
            continue  # A connection torch opened and closed unused.
        save("store_protocol", f"torch-{version}-{index}", b"\x00" + bytes(sent))
        save("store_protocol", f"torch-{version}-{index}-split", b"\x02" + bytes(sent))


capture_agent()
for python in PYTHONS:
    capture_store(python)
