// Crash-safe directory and file writes: see atomic_dir.h.
#include "src/io/atomic_dir.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "src/core/error.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), directory ? O_RDONLY | O_DIRECTORY : O_RDONLY);
  if (fd < 0) return;
  ::fsync(fd);
  ::close(fd);
}

}  // namespace

void create_output_dir(const std::string& path, const std::string& what) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) return;
  if (fs::exists(path, ec)) throw Error(what + ": " + path + " is a file, not a directory");
  fs::create_directories(path, ec);
  if (ec) {
    // Name the component in the way: a file where a directory should be; otherwise the system's reason.
    const std::string reason = ec.message();
    std::error_code probe;
    fs::path blocked(path);
    while (blocked.has_parent_path() && !fs::exists(blocked, probe)) blocked = blocked.parent_path();
    const bool file = fs::exists(blocked, probe) && !fs::is_directory(blocked, probe);
    throw Error(what + ": cannot create directory " + path + " (" + (file ? blocked.string() + " is a file" : reason) + ")");
  }
}

void prepare_output_file(const std::string& path, const std::string& what) {
  if (path.empty()) throw Error(what + ": the output path is empty");
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw Error(what + ": " + path + " is a directory (give the path of a file to write)");
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) create_output_dir(parent.string(), what);
}

AtomicDir::AtomicDir(std::string final_path) : AtomicDir(std::move(final_path), std::to_string(::getpid())) {}

std::string AtomicDir::temp_path(const std::string& final_path, const std::string& tag) {
  fs::path f(final_path);
  fs::path parent = f.parent_path().empty() ? fs::path(".") : f.parent_path();
  return (parent / (".tmp-" + f.filename().string() + "-" + tag)).string();
}

AtomicDir::AtomicDir(std::string final_path, const std::string& tag) : final_(std::move(final_path)) {
  fs::path f(final_);
  fs::path parent = f.parent_path().empty() ? fs::path(".") : f.parent_path();
  create_output_dir(parent.string(), final_);
  std::error_code ec;
  tmp_ = temp_path(final_, tag);
  fs::remove_all(tmp_, ec);
  fs::create_directory(tmp_, ec);
  if (ec) throw Error("cannot create directory " + tmp_ + ": " + ec.message());
}

AtomicDir::~AtomicDir() {
  if (committed_) return;
  std::error_code ec;
  fs::remove_all(tmp_, ec);
}

void AtomicDir::commit() {
  for (const auto& entry : fs::directory_iterator(tmp_)) fsync_path(entry.path().string(), false);
  fsync_path(tmp_, true);
  std::error_code ec;
  if (fs::exists(final_, ec)) {
    // rename() cannot replace a non-empty directory: move the old one aside first.
    std::string old = tmp_ + ".old";
    fs::rename(final_, old, ec);
    if (ec) throw Error("cannot replace " + final_ + ": " + ec.message());
    fs::rename(tmp_, final_, ec);
    fs::remove_all(old);
  } else {
    fs::rename(tmp_, final_, ec);
  }
  if (ec) throw Error("cannot move " + tmp_ + " to " + final_ + ": " + ec.message());
  fsync_path(fs::path(final_).parent_path().string(), true);
  committed_ = true;
}

void write_file_atomic(const std::string& path, const std::string& content) {
  std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << content;
    out.flush();
    if (!out) throw Error("cannot write " + tmp + ": " + std::strerror(errno));
  }
  fsync_path(tmp, false);
  if (const std::string reason = move_into_place(tmp, path); !reason.empty())
    throw Error("cannot move " + tmp + " to " + path + ": " + reason);
}

std::string move_into_place(const std::string& tmp, const std::string& path) {
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (!ec) return "";
  std::error_code ignored;
  fs::remove(tmp, ignored);
  return ec.message();
}

std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read " + path + (fs::exists(path) ? "" : ": no such file"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace colossal
