// Metrics writer: see metrics.h.
#include "src/engine/metrics.h"

#include "src/core/error.h"

namespace colossal {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw Error("cannot write metrics file " + path);
}

void MetricsWriter::write(const nlohmann::json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
}

}  // namespace colossal
