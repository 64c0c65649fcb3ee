// Logging setup: see log.h.
#include "src/core/log.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <spdlog/sinks/base_sink.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

namespace colossal {
namespace {

std::mutex g_line_mutex;
std::string g_line;   // progress line to redraw after each console message

// Console sink aware of the progress line: on a terminal it clears the line, writes the message and
// redraws the line, so logs scroll above a progress line that stays at the bottom.
class ConsoleSink : public spdlog::sinks::base_sink<std::mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    std::lock_guard<std::mutex> lock(g_line_mutex);
    bool tty = stderr_is_terminal();
    if (tty && !g_line.empty()) std::fputs("\r\033[K", stderr);
    std::fwrite(buf.data(), 1, buf.size(), stderr);
    if (tty && !g_line.empty()) std::fputs(g_line.c_str(), stderr);
    std::fflush(stderr);
  }
  void flush_() override { std::fflush(stderr); }
};

std::shared_ptr<ConsoleSink> g_console;
std::string g_rank_tag;   // "rank 3 " in a job of several processes

}  // namespace

bool stderr_is_terminal() {
  static const bool tty = isatty(fileno(stderr));
  return tty;
}

void set_progress_line(const std::string& line) {
  std::lock_guard<std::mutex> lock(g_line_mutex);
  g_line = line;
  if (stderr_is_terminal()) {
    std::fputs("\r\033[K", stderr);
    std::fputs(line.c_str(), stderr);
    std::fflush(stderr);
  }
}

void setup_logging(const std::string& level, const std::string& file, bool quiet) {
  g_console = std::make_shared<ConsoleSink>();
  g_console->set_pattern("[%H:%M:%S] %^%l%$ %v");
  g_console->set_level(quiet ? spdlog::level::warn : spdlog::level::from_str(level));
  auto logger = std::make_shared<spdlog::logger>("colossal", g_console);
  logger->set_level(spdlog::level::from_str(level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
  if (!file.empty()) set_log_file(file);
}

void set_log_rank(int64_t rank, int64_t world) {
  if (world <= 1 || !g_console) return;
  g_rank_tag = "rank " + std::to_string(rank) + " ";
  g_console->set_pattern("[%H:%M:%S] " + g_rank_tag + "%^%l%$ %v");
  if (rank != 0) g_console->set_level(std::max(g_console->level(), spdlog::level::warn));
}

void set_log_file(const std::string& file) {
  auto logger = spdlog::default_logger();
  auto& sinks = logger->sinks();
  sinks.erase(std::remove_if(sinks.begin(), sinks.end(),
                             [](auto& s) { return dynamic_cast<spdlog::sinks::basic_file_sink_mt*>(s.get()); }),
              sinks.end());
  auto fs = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file, /*truncate=*/false);
  fs->set_pattern("[%Y-%m-%d %H:%M:%S.%e] " + g_rank_tag + "%l %v");
  fs->set_level(logger->level());
  sinks.push_back(fs);
}

}  // namespace colossal
