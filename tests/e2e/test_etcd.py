"""The rendezvous on a real three-member etcd cluster (Debian's etcd-server): mcprun agents join it
with --rdzv-backend etcd, form, restart, grow and lose nodes, while members are killed and stopped;
nothing of a job is left in etcd after it."""
import base64
import json
import os
import re
import signal
import ssl
import subprocess
import time
import unittest
import urllib.request

from harness import MCPRUN, PYTHON, LauncherTestCase, reserve_port, wait_for
from test_netns import AFTER_INIT_HANG, NamespaceHosts, can_make_namespaces

ETCD = "/usr/bin/etcd"
# The lease every agent's keys live on (launcher/rendezvous/etcd_rendezvous.hpp's kEtcdLeaseTtl).
LEASE_TTL_S = 10

# Records its rank and the job's shape, then behaves as $BEHAVIOUR says (default: exit 0).
WORKER = r'''
echo $$ > "$MCPRUN_TEST_DIR/pid.$GROUP_RANK.$LOCAL_RANK"
echo "$RANK $GROUP_RANK $WORLD_SIZE $MASTER_ADDR $MASTER_PORT $TORCHELASTIC_RESTART_COUNT $NODE" \
  >> "$MCPRUN_TEST_DIR/rank.$RANK"
eval "${BEHAVIOUR:-exit 0}"
'''


# DDP steps for $DURATION_S (rank 0 leaves a "warm" file once they run), then a sum of ranks that
# each rank records with its MASTER_ADDR.
DDP = r'''
import json, os, time
import torch, torch.distributed as dist
dist.init_process_group("gloo", init_method="env://")
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(64, 64))
start = time.monotonic()
while True:
    elapsed = torch.tensor([time.monotonic() - start])
    dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # Every rank stops at the same step.
    if elapsed.item() > float(os.environ["DURATION_S"]):
        break
    if dist.get_rank() == 0:
        open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "warm"), "a").close()
    model(torch.randn(8, 64)).sum().backward()
    time.sleep(0.05)
value = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(value)
with open(os.path.join(os.environ["MCPRUN_TEST_DIR"], "node.%s.json" % os.environ["RANK"]), "w") as f:
    json.dump({"sum": value.item(), "master": os.environ["MASTER_ADDR"]}, f)
dist.barrier()
dist.destroy_process_group()
'''


class EtcdCluster:
    """Members on loopback (or each in a network namespace), each a process of its own; the test
    kills, stops and restarts them by index."""

    def __init__(self, test, members=3, hosts=None, tls=None):
        self.test = test
        self.hosts = hosts  # [(namespace, address)] per member, or None: loopback.
        # {"ca", "cert", "key", "client_cert", "client_key"}: TLS on the client URLs, or None.
        self.tls = tls
        self.scheme = "https" if tls else "http"
        self.addresses = [h[1] for h in hosts] if hosts else ["127.0.0.1"] * members
        if hosts:
            self.client_ports = [2379] * members
            self.peer_ports = [2380] * members
        else:
            self.client_ports = [reserve_port(test) for _ in range(members)]
            self.peer_ports = [reserve_port(test) for _ in range(members)]
        self.procs = [None] * members
        self.initial = ",".join(f"m{i}=http://{self.addresses[i]}:{self.peer_ports[i]}"
                                for i in range(members))
        for i in range(members):
            self.start(i)
        test.addCleanup(self.stop_all)
        test.assertIsNotNone(self.wait_for_leader(30), "the etcd cluster elected no leader")

    def endpoints(self):
        return ",".join(f"{a}:{p}" for a, p in zip(self.addresses, self.client_ports))

    def start(self, i):
        """Starts member i, or restarts it on the data it kept."""
        client = f"{self.scheme}://{self.addresses[i]}:{self.client_ports[i]}"
        peer = f"http://{self.addresses[i]}:{self.peer_ports[i]}"
        argv = [ETCD, "--name", f"m{i}", "--data-dir", os.path.join(self.test.tmp, f"etcd-m{i}"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", self.initial, "--initial-cluster-state", "new",
                # Elections in half a second, not the default's one: a test waits out a few.
                "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "error"]
        if self.tls:
            argv += ["--cert-file", self.tls["cert"], "--key-file", self.tls["key"],
                     "--trusted-ca-file", self.tls["ca"], "--client-cert-auth"]
        if self.hosts:
            argv = ["ip", "netns", "exec", self.hosts[i][0], *argv]
        log = open(os.path.join(self.test.tmp, f"etcd-m{i}.log"), "a")
        self.procs[i] = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        log.close()

    def kill(self, i):
        self.procs[i].kill()
        self.procs[i].wait()

    def signal(self, i, number):
        os.kill(self.procs[i].pid, number)

    def stop_all(self):
        for proc in self.procs:
            if proc and proc.poll() is None:
                os.kill(proc.pid, signal.SIGCONT)
                proc.kill()
                proc.wait()

    def call(self, i, path, body, timeout=1.0):
        """Member i's JSON answer to `body` at `path` (etcd's v3 gateway), or None."""
        url = f"{self.scheme}://{self.addresses[i]}:{self.client_ports[i]}{path}"
        if self.hosts:  # Only the namespaces reach the members.
            code = ("import sys, urllib.request; print(urllib.request.urlopen(urllib.request."
                    "Request(sys.argv[1], sys.argv[2].encode()), timeout=1).read().decode())")
            done = subprocess.run(["ip", "netns", "exec", self.hosts[i][0], PYTHON, "-c", code,
                                   url, json.dumps(body)], capture_output=True, text=True,
                                  timeout=timeout + 5)
            return json.loads(done.stdout) if done.returncode == 0 else None
        context = None
        if self.tls:
            context = ssl.create_default_context(cafile=self.tls["ca"])
            context.load_cert_chain(self.tls["client_cert"], self.tls["client_key"])
        try:
            request = urllib.request.Request(url, json.dumps(body).encode())
            with urllib.request.urlopen(request, timeout=timeout, context=context) as answer:
                return json.loads(answer.read())
        except (OSError, ValueError):
            return None

    def running(self):
        return [i for i, p in enumerate(self.procs) if p and p.poll() is None]

    def leader(self):
        """The index of the member that leads, or None while there is none."""
        for i in self.running():
            status = self.call(i, "/v3/maintenance/status", {})
            if status and status.get("leader") and status["leader"] == status["header"]["member_id"]:
                return i
        return None

    def wait_for_leader(self, timeout=20):
        """The leader's index once there is one, or None after `timeout` seconds."""
        found = wait_for(lambda: [self.leader()] if self.leader() is not None else None, timeout,
                         interval=0.1)
        return found[0] if found else None

    def keys(self, prefix="/mcprun/"):
        """Every key under `prefix`, read from any member that answers."""
        end = bytearray(prefix.encode())
        end[-1] += 1
        body = {"key": base64.b64encode(prefix.encode()).decode(),
                "range_end": base64.b64encode(bytes(end)).decode(), "keys_only": True}
        for i in self.running():
            answer = self.call(i, "/v3/kv/range", body)
            if answer is not None:
                return [base64.b64decode(kv["key"]).decode() for kv in answer.get("kvs", [])]
        return None


class EtcdTestCase(LauncherTestCase):
    def setUp(self):
        super().setUp()
        self.etcd = EtcdCluster(self)

    def agent(self, name, *args, job="job1", nnodes="2", nproc="1", extra_env=None,
              backend="etcd"):
        env = dict(self.env, NODE=name, **(extra_env or {}))
        command = ["--nnodes", nnodes, "-n", nproc, "--rdzv-backend", backend, "--rdzv-endpoint",
                   self.etcd.endpoints(), "--rdzv-id", job, "--node-name", name, *args,
                   "--no-python", "/bin/sh", "-c", WORKER]
        return self.start(*command, env=env)

    def finish(self, agents, timeout=90):
        results = []
        for proc in agents:
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                out, err = proc.communicate()
                self.fail(f"an agent hung:\n{err}\n" + "\n".join(e for _, _, e in results))
            results.append((proc.returncode, out, err))
        return results

    def ranks(self):
        """Rank -> the last line its workers recorded (rank, node rank, world, master address and
        port, restart count, node name)."""
        found = {}
        for name in self.files("rank."):
            with open(os.path.join(self.tmp, name)) as f:
                found[int(name.split(".")[1])] = f.read().split("\n")[-2].split()
        return found

    def node_ranks(self):
        """Each agent's node rank, by its name's number (node0, node1, ...)."""
        by_name = {int(fields[6][4:]): int(fields[1]) for fields in self.ranks().values()}
        return [by_name[n] for n in sorted(by_name)]

    def assert_no_keys_left(self, within=1.0):
        """Nothing of the job under /mcprun/ once its agents are gone (their leases revoked, or
        expired `within` seconds after)."""
        left = wait_for(lambda: self.etcd.keys() == [], within, interval=0.2)
        self.assertTrue(left, f"keys left in etcd: {self.etcd.keys()}")


class EtcdRendezvousTest(EtcdTestCase):
    def test_two_nodes_form_one_job_in_node_order_and_leave_no_key(self):
        agents = [self.agent(f"node{i}", nproc="2") for i in range(2)]
        results = self.finish(agents)
        for code, _, err in results:
            self.assertEqual(code, 0, err)
        ranks = self.ranks()
        self.assertEqual(sorted(ranks), [0, 1, 2, 3])
        self.assertEqual({r[2] for r in ranks.values()}, {"4"})  # WORLD_SIZE
        self.assertEqual(len({(r[3], r[4]) for r in ranks.values()}), 1)  # One master.
        self.assertEqual({ranks[r][1] for r in (0, 1)}, {ranks[0][1]})  # A node's ranks together.
        self.assert_no_keys_left()

    def test_torchruns_names_and_etcd_rdzv_conf_keys_are_taken(self):
        conf = "--rdzv-conf=timeout=30,last_call_timeout=1,protocol=http"
        agents = [self.agent(f"node{i}", conf, backend="etcd-v2", nnodes="1:2") for i in range(2)]
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
            self.assertNotIn("unused", err)

    def test_a_failed_worker_re_forms_the_job_on_every_node(self):
        # Node 1's worker fails on the first attempt, while node 0's runs; both succeed after.
        fail_once = ('if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then '
                     '[ "$GROUP_RANK" = 1 ] && { sleep 1; exit 7; }; exec sleep 60; fi')
        agents = [self.agent(f"node{i}", "--max-restarts", "1",
                             extra_env={"BEHAVIOUR": fail_once}) for i in range(2)]
        results = self.finish(agents)
        for code, _, err in results:
            self.assertEqual(code, 0, err)
        self.assertEqual({r[5] for r in self.ranks().values()}, {"1"})  # Both ran again.
        self.assertIn("restarting", "".join(err for _, _, err in results))
        self.assert_no_keys_left()

    def test_a_failure_with_no_restart_left_stops_every_node_with_its_cause(self):
        agents = [self.agent(f"node{i}", extra_env={
            "BEHAVIOUR": 'if [ "$GROUP_RANK" = 1 ]; then exit 7; fi; exec sleep 60'})
            for i in range(2)]
        results = self.finish(agents)
        self.assertEqual(sorted(code for code, _, _ in results), [7, 7], results)
        other = [err for code, _, err in results if "node node1:" in err]
        self.assertTrue(other, results)
        self.assertIn("exit code 7", other[0])
        self.assert_no_keys_left()

    def test_a_failure_after_another_node_finished_closes_the_job(self):
        # Node 0 finishes at once; node 1 fails a moment later, with a restart left.
        behaviour = {"BEHAVIOUR": '[ "$GROUP_RANK" = 1 ] && { sleep 2; exit 7; }; exit 0'}
        agents = [self.agent(f"node{i}", "--max-restarts", "1", extra_env=behaviour)
                  for i in range(2)]
        results = self.finish(agents)
        self.assertEqual(sorted(code for code, _, _ in results), [0, 7], results)
        failed = next(err for code, _, err in results if code == 7)
        self.assertRegex(failed, r"cannot restart: node\(s\) node\d finished")
        self.assertNotIn("restarting", failed)
        self.assert_no_keys_left(within=LEASE_TTL_S + 5)

    def test_a_killed_agent_is_lost_within_the_lease_and_its_keys_expire(self):
        behaviour = {"BEHAVIOUR": "exec sleep 120"}
        agents = [self.agent(f"node{i}", extra_env=behaviour) for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "workers did not start")
        os.killpg(agents[1].pid, signal.SIGKILL)  # The agent and its workers, as a host dies.
        killed = time.monotonic()
        code, _, err = self.finish(agents[:1])[0]
        noticed = time.monotonic() - killed
        self.assertEqual(code, 75, err)  # The rendezvous' exit code.
        self.assertIn("node1 was lost", err)
        self.assertLess(noticed, LEASE_TTL_S + 10, err)
        self.assert_no_keys_left(within=LEASE_TTL_S + 5)

    def test_a_third_node_that_comes_late_joins_the_running_job(self):
        # Each attempt runs until the job has three nodes.
        behaviour = {"BEHAVIOUR": '[ "$WORLD_SIZE" = 3 ] && exit 0; exec sleep 120'}
        conf = "--rdzv-conf=last_call_timeout=1"
        first = [self.agent(f"node{i}", conf, nnodes="2:3", extra_env=behaviour) for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "two nodes did not form")
        late = self.agent("node2", conf, nnodes="2:3", extra_env=behaviour)
        results = self.finish(first + [late])
        for code, _, err in results:
            self.assertEqual(code, 0, err)
        self.assertIn("joins the job", results[0][2])
        self.assertEqual({r[2] for r in self.ranks().values()}, {"3"})
        self.assert_no_keys_left()

    def test_a_full_job_refuses_a_node_in_one_line(self):
        behaviour = {"BEHAVIOUR": 'exec sleep 120'}
        agents = [self.agent(f"node{i}", extra_env=behaviour) for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "the job did not form")
        code, _, err = self.finish([self.agent("node9", extra_env=behaviour)])[0]
        self.assertEqual(code, 75, err)
        self.assertIn("is running with all 2 nodes", err)
        for proc in agents:
            os.killpg(proc.pid, signal.SIGTERM)
        self.finish(agents)


class EtcdFaultsTest(EtcdTestCase):
    """Members killed and stopped at the three moments of a job: it ends as it would have."""

    def faults(self):
        """kill -9 the leader (then restart it), then a follower (then restart it), then SIGSTOP
        a member and leave it stopped: each costs the agents a request deadline at most."""
        leader = self.etcd.wait_for_leader()
        self.assertIsNotNone(leader)
        self.etcd.kill(leader)
        self.etcd.start(leader)
        leader = self.etcd.wait_for_leader()
        self.assertIsNotNone(leader)
        follower = next(i for i in self.etcd.running() if i != leader)
        self.etcd.kill(follower)
        self.etcd.start(follower)
        leader = self.etcd.wait_for_leader()
        self.assertIsNotNone(leader)
        stopped = next(i for i in self.etcd.running() if i != leader)
        self.etcd.signal(stopped, signal.SIGSTOP)
        return stopped

    def test_members_lost_while_the_job_forms(self):
        first = self.agent("node0")
        self.faults()
        second = self.agent("node1")
        for code, _, err in self.finish([first, second]):
            self.assertEqual(code, 0, err)
        self.assertEqual(sorted(self.ranks()), [0, 1])
        self.assert_no_keys_left()

    def test_members_lost_while_the_job_runs(self):
        go = os.path.join(self.tmp, "go")
        behaviour = {"BEHAVIOUR": f'while [ ! -e {go} ]; do sleep 0.1; done'}
        agents = [self.agent(f"node{i}", extra_env=behaviour) for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "the job did not form")
        self.faults()
        time.sleep(LEASE_TTL_S / 2)  # A run, not a moment: the leases must be kept through it.
        open(go, "w").close()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
            self.assertNotIn("lost", err)
        self.assert_no_keys_left()

    def test_members_lost_while_the_job_re_forms(self):
        go = os.path.join(self.tmp, "go")
        # Node 0's first attempt fails once the faults are under way, while node 1's runs on; the
        # second attempt runs to its end on both.
        behaviour = {"BEHAVIOUR": f'[ "$TORCHELASTIC_RESTART_COUNT" = 0 ] || exit 0; '
                                  f'while [ ! -e {go} ]; do sleep 0.1; done; '
                                  '[ "$GROUP_RANK" = 0 ] && exit 3; exec sleep 60'}
        agents = [self.agent(f"node{i}", "--max-restarts", "1", extra_env=behaviour)
                  for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "the job did not form")
        leader = self.etcd.wait_for_leader()
        open(go, "w").close()
        self.etcd.kill(leader)  # While the nodes stop and join the next round.
        self.etcd.start(leader)
        self.faults()
        for code, _, err in self.finish(agents):
            self.assertEqual(code, 0, err)
        self.assertEqual({r[5] for r in self.ranks().values()}, {"1"})
        self.assert_no_keys_left()

    def test_every_member_down_lets_the_job_run_and_fails_its_restart_naming_etcd(self):
        go = os.path.join(self.tmp, "go")
        # Node 0's worker fails once every member is down; node 1's runs on, hearing nothing.
        behaviour = {"BEHAVIOUR": f'while [ ! -e {go} ]; do sleep 0.1; done; '
                                  '[ "$GROUP_RANK" = 0 ] && exit 3; exec sleep 60'}
        agents = [self.agent(f"node{i}", "--max-restarts", "1", "--rdzv-conf=timeout=5",
                             extra_env=behaviour) for i in range(2)]
        self.assertTrue(wait_for(lambda: len(self.files("pid.")) == 2, 60), "the job did not form")
        ranks = {node: proc for node, proc in zip(self.node_ranks(), agents)}
        for i in range(3):
            self.etcd.kill(i)
        open(go, "w").close()
        code, _, err = self.finish([ranks[0]], timeout=60)[0]
        self.assertEqual(code, 75, err)
        self.assertIn("etcd", err.strip().splitlines()[-1])
        self.assertIsNone(ranks[1].poll(), "the node that did not fail stopped without etcd")
        os.killpg(ranks[1].pid, signal.SIGTERM)
        self.finish([ranks[1]])


def openssl(directory, *args):
    subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)


class EtcdTlsTest(LauncherTestCase):
    """A member that asks every client for a certificate its CA signed, the CA made here."""

    def setUp(self):
        super().setUp()
        openssl(self.tmp, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                "-subj", "/CN=mcprun-test-ca", "-keyout", "ca.key", "-out", "ca.crt")
        with open(os.path.join(self.tmp, "san.cnf"), "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\n")
        for who in ("server", "client"):
            openssl(self.tmp, "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={who}",
                    "-keyout", f"{who}.key", "-out", f"{who}.csr")
            openssl(self.tmp, "x509", "-req", "-in", f"{who}.csr", "-CA", "ca.crt", "-CAkey",
                    "ca.key", "-CAcreateserial", "-days", "1", "-extfile", "san.cnf", "-out",
                    f"{who}.crt")
        path = lambda name: os.path.join(self.tmp, name)
        self.etcd = EtcdCluster(self, members=1, tls={
            "ca": path("ca.crt"), "cert": path("server.crt"), "key": path("server.key"),
            "client_cert": path("client.crt"), "client_key": path("client.key")})
        self.conf = (f"--rdzv-conf=protocol=https,cacert={path('ca.crt')},"
                     f"cert={path('client.crt')},key={path('client.key')}")

    def agent(self, name, conf, nnodes="2"):
        return self.start("--nnodes", nnodes, "-n", "1", "--rdzv-backend", "etcd",
                          "--rdzv-endpoint", self.etcd.endpoints(), "--rdzv-id", "tlsjob",
                          "--node-name", name, conf, "--no-python", "/bin/sh", "-c", WORKER,
                          env=dict(self.env, NODE=name))

    def test_agents_with_the_cas_client_certificate_form_the_job(self):
        agents = [self.agent(f"node{i}", self.conf) for i in range(2)]
        for proc in agents:
            _, err = proc.communicate(timeout=90)
            self.assertEqual(proc.returncode, 0, err)
        self.assertEqual(len(self.files("rank.")), 2)

    def test_an_agent_without_a_client_certificate_fails_in_one_line_naming_etcd(self):
        conf = f"--rdzv-conf=protocol=https,cacert={os.path.join(self.tmp, 'ca.crt')},timeout=3"
        proc = self.agent("node0", conf)
        _, err = proc.communicate(timeout=60)
        self.assertEqual(proc.returncode, 75, err)
        self.assertIn("etcd", err.strip().splitlines()[-1])


@unittest.skipUnless(can_make_namespaces(), "needs root and network namespaces (ip netns)")
class EtcdAcrossHosts(LauncherTestCase):
    """gloo jobs of three namespace hosts, each running an etcd member and an agent: one that runs
    on while the etcd leader is killed, one that stalls."""

    def setUp(self):
        super().setUp()
        self.net = NamespaceHosts(3)
        self.addCleanup(self.net.remove)
        self.etcd = EtcdCluster(self, hosts=[(self.net.names[i], self.net.address(i))
                                             for i in range(3)])

    def agent(self, i, *args):
        proc = subprocess.Popen(
            ["ip", "netns", "exec", self.net.names[i], MCPRUN, "--nnodes", "3", "-n", "1",
             "--rdzv-backend", "etcd", "--rdzv-endpoint", self.etcd.endpoints(),
             "--rdzv-id", "netjob", "--node-name", f"host{i}", *args],
            env=self.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            errors="replace", start_new_session=True)
        self.procs.append(proc)
        return proc

    def test_a_ddp_job_forms_across_hosts_and_outlives_its_etcd_leader(self):
        self.env["DURATION_S"] = "8"
        agents = [self.agent(i, self.script("ddp.py", DDP)) for i in range(3)]
        if not wait_for(lambda: os.path.exists(os.path.join(self.tmp, "warm")), 90):
            for proc in agents:
                os.killpg(proc.pid, signal.SIGKILL)
            self.fail("the job did not start:\n" + "\n".join(p.communicate()[1] for p in agents))
        self.etcd.kill(self.etcd.wait_for_leader())
        results = [proc.communicate(timeout=120) for proc in agents]
        for proc, (_, err) in zip(agents, results):
            self.assertEqual(proc.returncode, 0, "\n".join(e for _, e in results))
        for rank in range(3):
            with open(os.path.join(self.tmp, f"node.{rank}.json")) as f:
                node = json.load(f)
            self.assertEqual(node["sum"], 6.0)
            self.assertIn(node["master"], [self.net.address(i) for i in range(3)])
        self.assertEqual(self.etcd.keys(), [])

    def test_uneven_shards_across_hosts_stop_every_host_naming_the_stall(self):
        self.env["HANG"] = "uneven"
        script = self.script("hang.py", AFTER_INIT_HANG)
        agents = [self.agent(i, "--collective-timeout", "6", "--summary-json",
                             os.path.join(self.tmp, f"summary.{i}.json"), script)
                  for i in range(3)]
        errs = [proc.communicate(timeout=120)[1] for proc in agents]
        for i, proc in enumerate(agents):
            self.assertEqual(proc.returncode, 3, "\n".join(errs))
            self.assertIn("job STALLED", errs[i])
            with open(os.path.join(self.tmp, f"summary.{i}.json")) as f:
                self.assertEqual(json.load(f)["stall"]["collective"]["missing"], [1])
        self.assertEqual(self.etcd.keys(), [])


def load_tests(loader, tests, pattern):
    """The suite as `unittest test_etcd` runs it: the agents on loopback, with no torch. ctest
    runs EtcdAcrossHosts, the DDP job, once per torch."""
    return unittest.TestSuite(loader.loadTestsFromTestCase(case)
                              for case in (EtcdRendezvousTest, EtcdFaultsTest, EtcdTlsTest))
