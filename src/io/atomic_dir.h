// Crash-safe writes: a directory (or file) is built under a temporary name beside its final place,
// synced, then renamed into place, so readers see either the old complete version or the new one,
// never a half-written one. Checkpoints and the `latest` pointer are written this way.
#pragma once
#include <string>

namespace colossal {

class AtomicDir {
 public:
  explicit AtomicDir(std::string final_path);   // creates "<parent>/.tmp-<name>-<pid>"
  // Creates temp_path(final_path, tag): a name other processes can compute, so the ranks of a job
  // write their files into the one directory rank 0 commits.
  AtomicDir(std::string final_path, const std::string& tag);
  static std::string temp_path(const std::string& final_path, const std::string& tag);
  ~AtomicDir();                                  // removes the temporary directory if not committed
  AtomicDir(const AtomicDir&) = delete;
  AtomicDir& operator=(const AtomicDir&) = delete;

  const std::string& path() const { return tmp_; }   // write files here
  void commit();   // fsyncs every file, then renames onto the final path (replacing an older one)

 private:
  std::string final_, tmp_;
  bool committed_ = false;
};

// Output paths checked before anything is written, with errors that name `what` (the flag or recipe
// key that gave the path, e.g. "--out" or "recipes/x.toml:5: [data] tokenizer") instead of a bare
// filesystem_error. prepare_output_file refuses a directory at `path` and creates missing parents;
// create_output_dir creates `path` itself (refusing a file there).
void prepare_output_file(const std::string& path, const std::string& what);
void create_output_dir(const std::string& path, const std::string& what);

// Renames a finished temporary file `tmp` onto `path`. On failure removes `tmp` (no debris beside the
// output) and returns the system's reason; on success returns "".
std::string move_into_place(const std::string& tmp, const std::string& path);

// Writes `content` to `path` via a synced temporary file and a rename.
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_text_file(const std::string& path);   // Error if it cannot be read

}  // namespace colossal
