// The etcd client against real etcd members (Debian's etcd-server) on loopback: what it reads and
// writes, its leases and watches, and what a killed or stopped member costs it.
#include "launcher/etcd/etcd_client.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <fstream>
#include <thread>

#include "tests/temp_dir.hpp"

namespace mcprun::etcd {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

/// A port nothing listens on now, for a member to take.
int free_port() {
  boost::asio::io_context io;
  boost::asio::ip::tcp::acceptor acceptor(io, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return acceptor.local_endpoint().port();
}

/// Waits up to `limit` for `done`.
template <class Condition>
bool wait_for(Condition done, std::chrono::milliseconds limit) {
  const auto deadline = Clock::now() + limit;
  while (Clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(50ms);
  }
  return done();
}

/// A real cluster of etcd members on loopback, each a process of its own, killed at the end.
class EtcdCluster {
 public:
  explicit EtcdCluster(int members, std::vector<std::string> member_flags = {},
                       std::string scheme = "http")
      : dir_("mcprun-etcd") {
    std::string initial;
    for (int i = 0; i < members; ++i) {
      client_ports_.push_back(free_port());
      peer_ports_.push_back(free_port());
      initial += (i ? "," : "") + name(i) + "=http://127.0.0.1:" + std::to_string(peer_ports_[i]);
    }
    for (int i = 0; i < members; ++i) {
      const std::string client = scheme + "://127.0.0.1:" + std::to_string(client_ports_[i]);
      const std::string peer = "http://127.0.0.1:" + std::to_string(peer_ports_[i]);
      std::vector<std::string> argv = {
          "etcd", "--name", name(i), "--data-dir", (dir_ / name(i)).string(),
          "--listen-client-urls", client, "--advertise-client-urls", client, "--listen-peer-urls",
          peer, "--initial-advertise-peer-urls", peer, "--initial-cluster", initial,
          "--initial-cluster-state", "new",
          // Elections in half a second, not the default's one: a test waits out a few.
          "--heartbeat-interval", "50", "--election-timeout", "500", "--log-level", "error"};
      argv.insert(argv.end(), member_flags.begin(), member_flags.end());
      pids_.push_back(spawn(argv, dir_ / (name(i) + ".log")));
    }
  }
  ~EtcdCluster() {
    for (pid_t pid : pids_)
      if (pid > 0) {
        ::kill(pid, SIGKILL);
        ::waitpid(pid, nullptr, 0);
      }
  }

  std::vector<Endpoint> endpoints() const {
    std::vector<Endpoint> out;
    for (int port : client_ports_) out.push_back({"127.0.0.1", port, ""});
    return out;
  }
  void signal(int member, int signal) {
    ::kill(pids_[member], signal);
    if (signal == SIGKILL) {
      ::waitpid(pids_[member], nullptr, 0);
      pids_[member] = -1;
    }
  }
  const mcprun::testing::TempDir& dir() const { return dir_; }

 private:
  static std::string name(int i) { return "m" + std::to_string(i); }
  static pid_t spawn(const std::vector<std::string>& argv, const std::filesystem::path& log) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      std::vector<char*> args;
      for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
      args.push_back(nullptr);
      const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(out, 1);
      ::dup2(out, 2);
      ::execvp(args[0], args.data());
      ::_exit(127);
    }
    return pid;
  }

  mcprun::testing::TempDir dir_;
  std::vector<int> client_ports_, peer_ports_;
  std::vector<pid_t> pids_;
};

Settings settings_for(const EtcdCluster& cluster, std::chrono::milliseconds timeout = 1000ms) {
  Settings settings;
  settings.members = cluster.endpoints();
  settings.request_timeout = timeout;
  return settings;
}

/// A client once the cluster has elected a leader and answers.
bool cluster_answers(Client& client) {
  return wait_for([&] { return bool(client.put("/mcprun-test/ready", "1")); }, 20s);
}

TEST(EtcdClient, KeysTransactionsAndPrefixesOnARealCluster) {
  EtcdCluster cluster(3);
  Client client(settings_for(cluster));
  ASSERT_TRUE(cluster_answers(client));

  auto created = client.create("/job/a/node/0", "host0");
  ASSERT_TRUE(created) << created.error().message;
  EXPECT_TRUE(created->succeeded);
  auto again = client.create("/job/a/node/0", "host1");
  ASSERT_TRUE(again);
  EXPECT_FALSE(again->succeeded);
  ASSERT_TRUE(again->current);
  EXPECT_EQ(again->current->value, "host0");  // What made it fail, read in the same request.

  auto stale = client.compare_and_swap("/job/a/node/0", again->current->mod_revision - 1, "x");
  ASSERT_TRUE(stale);
  EXPECT_FALSE(stale->succeeded);
  auto swapped = client.compare_and_swap("/job/a/node/0", again->current->mod_revision, "host2");
  ASSERT_TRUE(swapped);
  EXPECT_TRUE(swapped->succeeded);

  ASSERT_TRUE(client.put("/job/a/node/1", std::string("\0\xff bytes", 8)));
  ASSERT_TRUE(client.put("/job/ab", "outside the prefix"));
  int64_t revision = 0;
  auto keys = client.range_prefix("/job/a/", &revision);
  ASSERT_TRUE(keys) << keys.error().message;
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].value, "host2");
  EXPECT_EQ((*keys)[1].value, std::string("\0\xff bytes", 8));
  EXPECT_GE(revision, (*keys)[1].mod_revision);

  EXPECT_EQ(*client.delete_prefix("/job/a/"), 2);
  EXPECT_FALSE(*client.get("/job/a/node/0"));
  EXPECT_EQ((*client.get("/job/ab"))->value, "outside the prefix");
}

TEST(EtcdClient, AKeyOnALeaseGoesWithItAndAKeptLeaseStays) {
  EtcdCluster cluster(1);
  Client client(settings_for(cluster));
  ASSERT_TRUE(cluster_answers(client));
  auto kept = client.grant_lease(2s);
  auto dropped = client.grant_lease(2s);
  ASSERT_TRUE(kept && dropped);
  ASSERT_TRUE(client.put("/job/kept", "1", *kept));
  ASSERT_TRUE(client.put("/job/dropped", "1", *dropped));
  const auto deadline = Clock::now() + 15s;
  while (Clock::now() < deadline && *client.get("/job/dropped")) {
    EXPECT_GT(*client.keep_alive(*kept), 0);
    std::this_thread::sleep_for(300ms);
  }
  EXPECT_FALSE(*client.get("/job/dropped"));
  EXPECT_TRUE(*client.get("/job/kept"));
  EXPECT_EQ(*client.keep_alive(*dropped), 0);  // Expired: a TTL of 0, not an error.
  ASSERT_TRUE(client.revoke(*kept));
  EXPECT_FALSE(*client.get("/job/kept"));
}

TEST(EtcdClient, AWatchReturnsTheEventsAfterARevisionOrNothingAtItsLimit) {
  EtcdCluster cluster(1);
  Client client(settings_for(cluster));
  ASSERT_TRUE(cluster_answers(client));
  int64_t revision = 0;
  ASSERT_TRUE(client.range_prefix("/job/", &revision));

  const auto start = Clock::now();
  auto quiet = client.watch_prefix("/job/", revision + 1, 300ms);
  ASSERT_TRUE(quiet) << quiet.error().message;
  EXPECT_TRUE(quiet->events.empty());
  EXPECT_LT(Clock::now() - start, 2s);

  ASSERT_TRUE(client.put("/job/x", "1"));
  ASSERT_TRUE(client.put("/other", "1"));
  ASSERT_TRUE(client.delete_prefix("/job/x"));
  auto seen = client.watch_prefix("/job/", revision + 1, 5s);
  ASSERT_TRUE(seen) << seen.error().message;
  ASSERT_EQ(seen->events.size(), 2u);  // The put and the delete; /other is outside.
  EXPECT_EQ(seen->events[0].kv.value, "1");
  EXPECT_EQ(seen->events[1].type, WatchEvent::Type::kDelete);
  auto after = client.watch_prefix("/job/", seen->revision + 1, 200ms);
  ASSERT_TRUE(after);
  EXPECT_TRUE(after->events.empty());
}

TEST(EtcdClient, AKilledMemberAndAStoppedOneCostOneRequestDeadlineNotAHang) {
  EtcdCluster cluster(3);
  Client client(settings_for(cluster, 1000ms));
  ASSERT_TRUE(cluster_answers(client));
  const auto asked = [&] {
    const auto members = cluster.endpoints();
    for (size_t i = 0; i < members.size(); ++i)
      if (members[i].text() == client.member()) return static_cast<int>(i);
    return -1;
  };

  // The member it asks is killed: the next one answers.
  const int killed = asked();
  cluster.signal(killed, SIGKILL);
  ASSERT_TRUE(wait_for([&] { return bool(client.put("/job/after-kill", "1")); }, 10s));
  EXPECT_NE(asked(), killed);

  // The member now asked stops answering without closing anything.
  const int stopped = asked();
  cluster.signal(stopped, SIGSTOP);
  const auto start = Clock::now();
  auto answer = client.get("/job/after-kill");
  const auto took = Clock::now() - start;
  cluster.signal(stopped, SIGCONT);
  // Two of three members down: no quorum, so the last one may not answer; it must not hang.
  EXPECT_LT(took, 4s) << (answer ? "answered" : answer.error().message);
  if (!answer) {
    EXPECT_NE(answer.error().message.find("no etcd member answered"), std::string::npos);
  }
  ASSERT_TRUE(wait_for([&] { return bool(client.get("/job/after-kill")); }, 10s));
}

TEST(EtcdClient, NoMemberUpIsOneLineNamingEachMember) {
  Settings settings;
  settings.members = {{"127.0.0.1", free_port(), ""}, {"127.0.0.1", free_port(), ""}};
  settings.request_timeout = 500ms;
  Client client(settings);
  auto answer = client.get("/x");
  ASSERT_FALSE(answer);
  EXPECT_NE(answer.error().message.find("no etcd member answered"), std::string::npos);
  EXPECT_NE(answer.error().message.find(settings.members[1].text()), std::string::npos);
  EXPECT_EQ(answer.error().message.find('\n'), std::string::npos);
}

/// openssl's command line, quietly; false when it fails.
bool openssl(const std::string& arguments, const std::filesystem::path& dir) {
  return std::system(
             ("cd " + dir.string() + " && openssl " + arguments + " >/dev/null 2>&1").c_str()) == 0;
}

TEST(EtcdClient, TlsWithTheClustersCaAndAClientCertificate) {
  mcprun::testing::TempDir certs("mcprun-etcd-tls");
  const auto& dir = certs.path();
  ASSERT_TRUE(
      openssl("req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=test-ca "
              "-keyout ca.key -out ca.crt",
              dir));
  std::ofstream(dir / "san.cnf") << "subjectAltName=IP:127.0.0.1\n";
  for (const char* who : {"server", "client"}) {
    const std::string name = who;
    ASSERT_TRUE(openssl("req -newkey rsa:2048 -nodes -subj /CN=" + name + " -keyout " + name +
                            ".key -out " + name + ".csr",
                        dir));
    ASSERT_TRUE(openssl("x509 -req -in " + name +
                            ".csr -CA ca.crt -CAkey ca.key -CAcreateserial "
                            "-days 1 -extfile san.cnf -out " +
                            name + ".crt",
                        dir));
  }
  EtcdCluster cluster(
      1,
      {"--cert-file", (dir / "server.crt").string(), "--key-file", (dir / "server.key").string(),
       "--client-cert-auth", "--trusted-ca-file", (dir / "ca.crt").string()},
      "https");
  Settings settings = settings_for(cluster);
  settings.tls = true;
  settings.ca_file = (dir / "ca.crt").string();
  settings.cert_file = (dir / "client.crt").string();
  settings.key_file = (dir / "client.key").string();
  Client client(settings);
  ASSERT_TRUE(cluster_answers(client));
  EXPECT_EQ((*client.get("/mcprun-test/ready"))->value, "1");

  Settings without_certificate = settings;
  without_certificate.cert_file.clear();
  without_certificate.key_file.clear();
  auto refused = Client(without_certificate).get("/mcprun-test/ready");
  EXPECT_FALSE(refused);
  Settings untrusting = settings;
  untrusting.ca_file = (dir / "client.crt").string();  // Not the CA that signed the member.
  auto unverified = Client(untrusting).get("/mcprun-test/ready");
  ASSERT_FALSE(unverified);
  EXPECT_NE(unverified.error().message.find("TLS handshake"), std::string::npos);
}

}  // namespace
}  // namespace mcprun::etcd
