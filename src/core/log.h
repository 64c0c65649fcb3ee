// Logging: spdlog to the console (stderr) and to a run's log file. The console sink cooperates with
// the progress line (progress.h): a message clears the line, prints, and the line is redrawn.
#pragma once
#include <cstdint>
#include <string>

namespace colossal {

// Level: trace|debug|info|warn|error. `file` may be empty (console only). `quiet` keeps the console
// to warnings and errors (the file still gets everything at `level`).
void setup_logging(const std::string& level, const std::string& file = "", bool quiet = false);
// Adds (or replaces) the log file once the run's directory is known.
void set_log_file(const std::string& file);

// In a job of several processes: every console and file line carries "rank N"; ranks other than 0 keep
// the console to warnings and errors (rank 0 speaks for the job: progress, metrics, checkpoints).
void set_log_rank(int64_t rank, int64_t world);

// The progress line currently shown at the bottom of a terminal (empty: none).
void set_progress_line(const std::string& line);
bool stderr_is_terminal();

}  // namespace colossal
