#include "launcher/watch/stack_dump.hpp"

#include <fcntl.h>
#include <signal.h>
extern "C" {  // glibc 2.36 declares these without C linkage.
#include <sys/pidfd.h>
}
#include <unistd.h>

#include <algorithm>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>

#include "common/logging.hpp"
#include "common/sys.hpp"
#include "common/unique_fd.hpp"
#include "launcher/process/deadline.hpp"

extern char** environ;

namespace mcprun {
namespace {

std::vector<std::string> launcher_environment() {
  std::vector<std::string> env;
  for (char** entry = environ; *entry; ++entry) env.emplace_back(*entry);
  return env;
}

}  // namespace

std::string StackDumpTool::name() const {
  switch (kind) {
    case Kind::kPySpy:
      return "py-spy";
    case Kind::kGdb:
      return "gdb";
    case Kind::kNone:
      break;
  }
  return "none";
}

std::vector<std::string> StackDumpTool::argv(pid_t pid) const {
  const std::string target = std::to_string(pid);
  switch (kind) {
    case Kind::kPySpy:
      return {program, "dump", "--native", "--pid", target};
    case Kind::kGdb:
      // No init files, no pager, no debuginfod downloads: a dump must not wait on anything.
      return {program,
              "-nx",
              "-batch",
              "-iex",
              "set debuginfod enabled off",
              "-ex",
              "set pagination off",
              "-ex",
              "thread apply all bt",
              "-p",
              target};
    case Kind::kNone:
      break;
  }
  return {};
}

StackDumpTool StackDumpTool::find(std::string_view search_path) {
  if (auto py_spy = find_executable("py-spy", search_path)) return {Kind::kPySpy, *py_spy};
  if (auto gdb = find_executable("gdb", search_path)) return {Kind::kGdb, *gdb};
  return {};
}

StackDumpTool StackDumpTool::find_on_path() {
  const char* path = std::getenv("PATH");
  return find(path ? path : "");
}

struct StackDumper::Dump : std::enable_shared_from_this<Dump> {
  /// The caller's completion, shared by every dump of one dump_all().
  struct Batch {
    size_t remaining;
    std::function<void()> done;
  };

  Dump(boost::asio::io_context& io, ProcessControl& control, StackDumpRequest request,
       std::shared_ptr<Batch> batch, std::chrono::milliseconds timeout)
      : io(io),
        control(control),
        request(std::move(request)),
        batch(std::move(batch)),
        timeout(timeout),
        deadline(io) {}

  void start(const StackDumpTool& tool);
  void on_deadline();
  /// Stops waiting: the destructor of StackDumper is running.
  void abandon();
  void finish();
  /// Finishes from the loop, so `done` never runs inside dump_all().
  void finish_later() {
    boost::asio::post(deadline.get_executor(), [self = shared_from_this()] { self->finish(); });
  }
  void note(const std::string& line) { ::dprintf(output.get(), "%s\n", line.c_str()); }

  boost::asio::io_context& io;
  ProcessControl& control;
  StackDumpRequest request;
  std::shared_ptr<Batch> batch;
  std::chrono::milliseconds timeout;
  std::string tool_name;
  UniqueFd output;
  UniqueFd target;  ///< pidfd of the dumped process: SIGCONT reaches it even if its pid is reused.
  pid_t dumper = 0;
  std::optional<ChildProcess> child;  ///< The dumper, awaited through its pidfd until it ends.
  std::optional<ProcessExit> exit;    ///< How it ended, once its wait reaped it.
  bool reaped = false;                ///< Its wait ended: nothing left to collect or kill.
  boost::asio::steady_timer deadline;
  std::string killed_because;  ///< Empty unless mcprun SIGKILLed the dumper.
  bool finished = false;
};

void StackDumper::Dump::start(const StackDumpTool& tool) {
  tool_name = tool.name();
  // O_APPEND: our header and trailer and the dumper's own output never overwrite each other.
  output.reset(
      ::open(request.output.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644));
  if (!output.valid()) {
    spdlog::warn("cannot write the stack dump of pid {} to {}: {}", request.pid,
                 request.output.string(), std::strerror(errno));
    return finish_later();
  }
  note("# mcprun stack dump of pid " + std::to_string(request.pid) + " by " + tool_name + " at " +
       utc_timestamp());
  auto target_pidfd = open_pidfd(request.pid);
  if (!target_pidfd) {
    note("# mcprun: " + target_pidfd.error().message);
    return finish_later();
  }
  target = std::move(*target_pidfd);
  if (tool.kind == StackDumpTool::Kind::kNone) {
    note("no stack dumper found (install gdb or py-spy)");
    return finish_later();
  }
  auto pid = control.spawn(
      {tool.argv(request.pid), launcher_environment(), {}, output.get(), output.get()});
  if (!pid) {
    note("# mcprun: cannot start " + tool_name + ": " + pid.error().message);
    return finish_later();
  }
  dumper = *pid;
  auto watched = watch_child(io, dumper);
  if (!watched) {  // Without it we cannot learn of the exit: do not leave the dumper unbounded.
    killed_because = "could not be watched (" + watched.error().message + ")";
    control.signal_group(dumper, SIGKILL);
    return finish_later();
  }
  child.emplace(std::move(*watched));
  child->async_wait([self = shared_from_this()](boost::system::error_code ec, int) {
    if (ec == boost::asio::error::operation_aborted) return;
    self->exit = exit_of(self->control, *self->child, ec);
    self->reaped = true;
    self->finish();
  });
  deadline.expires_after(timeout);
  deadline.async_wait([self = shared_from_this()](boost::system::error_code ec) {
    if (!ec) self->on_deadline();
  });
}

void StackDumper::Dump::on_deadline() {
  if (finished) return;
  if (killed_because.empty()) {
    killed_because = "did not finish within " + std::to_string(timeout.count()) + " ms";
    control.signal_group(dumper, SIGKILL);
    // Its target is resumed only once it is gone: a tracer still alive would stop it again.
    deadline.expires_after(kDumperKillTimeout);
    deadline.async_wait([self = shared_from_this()](boost::system::error_code ec) {
      if (!ec) self->on_deadline();
    });
    return;
  }
  spdlog::warn("{} (pid {}) is still running {} s after SIGKILL; no longer waiting for it",
               tool_name, dumper, kDumperKillTimeout.count());
  finish();
}

void StackDumper::Dump::abandon() {
  if (finished) return;
  batch.reset();
  if (child && !reaped) {
    if (killed_because.empty()) killed_because = "was still running when mcprun stopped dumping";
    kill_and_wait(control, dumper);
  }
  finish();
}

void StackDumper::Dump::finish() {
  if (finished) return;
  finished = true;
  deadline.cancel();
  // Not awaited any longer; v2 would SIGKILL a running child and wait for it unbounded.
  if (child) child->detach();
  // nullopt when the launcher's reap() collected it first; its output is in the file either way.
  if (dumper > 0 && !reaped) exit = control.reap_one(dumper);
  if (!killed_because.empty())
    note("# mcprun: " + tool_name + " " + killed_because + "; killed it");
  else if (exit && !exit->succeeded())
    note("# mcprun: " + tool_name + " ended with " + describe_exit(exit->exit_code, exit->signal));
  // A dumper that died while attached can leave its target stopped; SIGCONT is harmless to one
  // that runs.
  if (dumper > 0 && target.valid() && !(exit && exit->succeeded()))
    ::pidfd_send_signal(target.get(), SIGCONT, nullptr, 0);
  output.reset();
  target.reset();
  if (auto owner = std::move(batch); owner && --owner->remaining == 0 && owner->done) owner->done();
}

StackDumper::StackDumper(boost::asio::io_context& io, ProcessControl& control, StackDumpTool tool)
    : io_(io), control_(control), tool_(std::move(tool)) {}

StackDumper::~StackDumper() {
  for (const auto& weak : dumps_)
    if (auto dump = weak.lock()) dump->abandon();
}

void StackDumper::dump_all(std::vector<StackDumpRequest> requests,
                           std::chrono::milliseconds timeout, std::function<void()> done) {
  auto batch = std::make_shared<Dump::Batch>(Dump::Batch{requests.size(), std::move(done)});
  if (requests.empty()) {
    boost::asio::post(io_, [batch] {
      if (batch->done) batch->done();
    });
    return;
  }
  std::erase_if(dumps_, [](const std::weak_ptr<Dump>& dump) { return dump.expired(); });
  for (StackDumpRequest& request : requests) {
    auto dump = std::make_shared<Dump>(io_, control_, std::move(request), batch, timeout);
    dumps_.push_back(dump);
    dump->start(tool_);
  }
}

}  // namespace mcprun
