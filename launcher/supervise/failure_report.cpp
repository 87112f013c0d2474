#include "launcher/supervise/failure_report.hpp"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "common/exit_status.hpp"
#include "common/sys.hpp"
#include "launcher/process/process_control.hpp"
#include "launcher/supervise/output_relay.hpp"

namespace mcprun {
namespace {

void indent_lines(std::ostringstream& out, const std::string& text, const char* indent) {
  std::istringstream lines(text);
  for (std::string line; std::getline(lines, line);) out << indent << line << "\n";
}

}  // namespace

std::optional<RecordedError> read_error_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) return std::nullopt;
  nlohmann::json json = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!json.is_object() || !json.contains("message")) return std::nullopt;
  RecordedError error;
  const nlohmann::json& message = json["message"];
  if (message.is_string()) {
    error.message = message.get<std::string>();
  } else if (message.is_object()) {
    error.message = message.value("message", "");
    if (auto info = message.find("extraInfo"); info != message.end() && info->is_object()) {
      error.traceback = info->value("py_callstack", "");
      error.timestamp = info->value("timestamp", "");
    }
  } else {
    return std::nullopt;
  }
  return error;
}

std::vector<std::string> failure_text(const WorkerOutcome& worker) {
  std::vector<std::string> lines(worker.tail.begin(), worker.tail.end());
  if (auto recorded = read_error_file(worker.error_file)) {
    std::istringstream message(recorded->message);
    for (std::string line; std::getline(message, line);) lines.push_back(line);
  }
  return lines;
}

int exit_code_for(const WorkerOutcome& worker) {
  return worker.signal != 0 ? exit_code_for_signal(worker.signal) : worker.exit_code;
}

std::string format_failure_report(const std::vector<WorkerOutcome>& workers, size_t first_failure,
                                  const std::string& host, int restart_count, int max_restarts,
                                  const std::map<int, std::string>& collectives,
                                  const std::string& hint) {
  const WorkerOutcome& root = workers.at(first_failure);
  const std::string rule(72, '=');
  std::ostringstream out;
  out << rule << "\nmcprun: worker group failed (attempt " << restart_count << ", restarts left "
      << (max_restarts - restart_count) << ")\n"
      << std::string(72, '-') << "\nRoot cause (first failure):\n"
      << "  rank:       " << root.rank << " (local rank " << root.local_rank << ")\n"
      << "  host:       " << host << "\n"
      << "  pid:        " << root.pid << "\n"
      << "  exit:       " << describe_exit(root.exit_code, root.signal) << "\n"
      << "  time:       " << utc_timestamp(root.exit_time) << "\n";
  if (!hint.empty()) out << "  hint:       " << hint << "\n";
  if (auto recorded = read_error_file(root.error_file)) {
    out << "  error file: " << root.error_file.string() << "\n"
        << "  message:    " << recorded->message << "\n";
    if (!recorded->traceback.empty()) {
      out << "  traceback:\n";
      indent_lines(out, recorded->traceback, "    ");
    }
  } else {
    out << "  error file: <not written> (decorate main with "
           "torch.distributed.elastic.multiprocessing.errors.record for a traceback)\n";
  }
  out << "  last output (" << root.tail.size() << " lines):\n";
  for (const auto& line : root.tail) out << "    " << printable_text(line) << "\n";

  std::vector<const WorkerOutcome*> also_failed;
  std::string stopped;
  for (size_t i = 0; i < workers.size(); ++i) {
    if (i == first_failure) continue;
    const WorkerOutcome& worker = workers[i];
    if (worker.stopped_by_launcher)
      stopped += (stopped.empty() ? "" : ",") + std::to_string(worker.rank);
    else if (worker.failed())
      also_failed.push_back(&worker);
  }
  if (!also_failed.empty()) {
    out << "Other ranks that failed by themselves:\n";
    for (const WorkerOutcome* worker : also_failed)
      out << "  rank " << worker->rank << " (local rank " << worker->local_rank << ", pid "
          << worker->pid << "): " << describe_exit(worker->exit_code, worker->signal) << " at "
          << utc_timestamp(worker->exit_time) << "\n";
  }
  if (!stopped.empty()) out << "Stopped by mcprun: rank(s) " << stopped << "\n";
  if (!collectives.empty()) {
    // A process-group timeout names no collective; the ranks' last progress records do.
    out << "Collectives at the failure (each rank's last progress record):\n";
    for (const auto& [rank, state] : collectives) out << "  rank " << rank << ": " << state << "\n";
  }
  out << rule << "\n";
  return out.str();
}

}  // namespace mcprun
