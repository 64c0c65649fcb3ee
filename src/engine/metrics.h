// Metrics: one JSON object per line (metrics.jsonl in the run directory), flushed as written so a
// crashed run keeps everything up to its last step; readable with jq, pandas or a plotting script.
#pragma once
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace colossal {

class MetricsWriter {
 public:
  MetricsWriter(const std::string& path, bool append);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

}  // namespace colossal
