// The memory profile's report: see memory_profile.h.
#include "src/engine/memory_profile.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <sstream>

#include "src/core/text.h"

namespace colossal {
namespace {

using nlohmann::json;

json bytes_json(const memory::ChunkBytes& b) {
  return {{"params", b.params}, {"grads", b.grads}, {"optimizer", b.optimizer}, {"staging", b.staging}, {"host", b.host}, {"nvme", b.nvme}};
}

// Non-model bytes live at an event: activations, workspace and buffers outside the store, which is ATen's
// live bytes less the store's ATen tensors (its staging buffers are aligned memory of its own).
int64_t other_bytes(const memory::MemoryTracer::Event& e) { return std::max<int64_t>(0, e.live - (e.held.total() - e.held.staging)); }

std::string escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '<') out += "&lt;";
    else if (c == '>') out += "&gt;";
    else if (c == '&') out += "&amp;";
    else if (c == '"') out += "&quot;";
    else out += c;
  }
  return out;
}

// Where a chunk is at an event (MemoryTracer::Tier): its letter in the JSON, what it means, its colour.
struct TierKey {
  char letter;
  const char* meaning;
  const char* color;
};
constexpr TierKey kTiers[] = {{'w', "whole on the device", "#4e79a7"},
                              {'s', "this rank's shard on the device", "#c9d8ea"},
                              {'h', "this rank's shard in host memory", "#9c755f"},
                              {'n', "on NVMe only", "#f28e2b"}};

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f", v);
  return buf;
}

}  // namespace

json memory_profile_json(const memory::ChunkStore& store, const memory::MemoryTracer& tracer, const std::string& title) {
  const auto& layout = store.layout();
  const auto& events = tracer.events();
  int64_t blocks = 0;
  for (size_t i = 0; i < layout.slots.size(); ++i) blocks = std::max(blocks, store.block_of_slot(static_cast<int64_t>(i)) + 1);
  // The store's bytes by block (index `blocks`: the tensors outside the blocks), each chunk's shared
  // among its tensors by their elements.
  std::vector<std::array<double, 4>> model(static_cast<size_t>(blocks) + 1, {0, 0, 0, 0});
  std::vector<int64_t> numel(static_cast<size_t>(blocks) + 1, 0);
  json chunks = json::array();
  for (int64_t c = 0; c < layout.chunks(); ++c) {
    const memory::ChunkBytes b = store.chunk_bytes(c);
    int64_t used = 0;
    std::vector<int64_t> owners;
    for (int64_t i : layout.chunk_slots[static_cast<size_t>(c)]) used += layout.slots[static_cast<size_t>(i)].numel;
    for (int64_t i : layout.chunk_slots[static_cast<size_t>(c)]) {
      const int64_t blk = store.block_of_slot(i);
      const auto k = static_cast<size_t>(blk < 0 ? blocks : blk);
      const double share = static_cast<double>(layout.slots[static_cast<size_t>(i)].numel) / static_cast<double>(std::max<int64_t>(used, 1));
      model[k][0] += share * static_cast<double>(b.params);
      model[k][1] += share * static_cast<double>(b.grads);
      model[k][2] += share * static_cast<double>(b.optimizer);
      model[k][3] += share * static_cast<double>(b.nvme);
      numel[k] += layout.slots[static_cast<size_t>(i)].numel;
      if (std::find(owners.begin(), owners.end(), blk) == owners.end()) owners.push_back(blk);
    }
    json j = bytes_json(b);
    j["chunk"] = c;
    j["elements"] = layout.chunk_sizes[static_cast<size_t>(c)];
    j["blocks"] = owners;   // -1: tensors outside the blocks
    chunks.push_back(j);
  }
  // Activations each block's forward kept and the peaks of its forward and backward, from the first
  // micro-batch's events (later ones repeat them).
  std::vector<double> kept(static_cast<size_t>(blocks), -1), fwd_peak(static_cast<size_t>(blocks), -1), bwd_peak(static_cast<size_t>(blocks), -1);
  std::map<std::pair<std::string, int64_t>, const memory::MemoryTracer::Event*> entered;
  for (const auto& e : events) {
    if (e.block < 0 || e.block >= blocks) continue;
    const auto k = static_cast<size_t>(e.block);
    if (e.enter) {
      entered[{e.phase, e.block}] = &e;
      continue;
    }
    const auto* in = entered[{e.phase, e.block}];
    if (!in) continue;
    if (e.phase == "forward" && kept[k] < 0) {
      kept[k] = static_cast<double>(other_bytes(e) - other_bytes(*in));
      fwd_peak[k] = static_cast<double>(e.peak);
    }
    if (e.phase == "backward" && bwd_peak[k] < 0) bwd_peak[k] = static_cast<double>(e.peak);
  }
  json per_block = json::array();
  for (int64_t b = 0; b <= blocks; ++b) {
    const auto k = static_cast<size_t>(b);
    json j = {{"block", b < blocks ? json(b) : json("outside")}, {"elements", numel[k]}, {"params", model[k][0]}, {"grads", model[k][1]},
              {"optimizer", model[k][2]}, {"nvme", model[k][3]}};
    if (b < blocks) {
      j["activations"] = std::max(0.0, kept[k]);
      j["forward_peak"] = std::max(0.0, fwd_peak[k]);
      j["backward_peak"] = std::max(0.0, bwd_peak[k]);
    }
    per_block.push_back(j);
  }
  json timeline = json::array();
  size_t at_peak = 0;
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    if (e.peak > events[at_peak].peak) at_peak = i;
    timeline.push_back({{"phase", e.phase}, {"block", e.block}, {"enter", e.enter}, {"t_ms", e.t_ms}, {"live", e.live}, {"peak", e.peak},
                        {"held", bytes_json(e.held)}, {"other", other_bytes(e)}, {"tiers", e.tiers}});
  }
  json peak = json::object();
  if (!events.empty()) {
    const auto& e = events[at_peak];
    // The peak of an interval is recorded at the event that ends it.
    const std::string where = e.block >= 0 ? "block " + std::to_string(e.block) + "'s " + e.phase : "before " + e.phase;
    peak = {{"bytes", e.peak}, {"where", where}, {"t_ms", e.t_ms}};
  }
  json tiers = json::object();
  for (const auto& t : kTiers) tiers[std::string(1, t.letter)] = t.meaning;
  const memory::ChunkBytes total = store.bytes();
  json totals = bytes_json(total);
  return {{"title", title},
          {"zero_stage", store.stage()},
          {"mixed_precision", store.mixed()},
          {"elements", layout.total_numel() - layout.padding()},   // the parameters'
          {"padded_elements", layout.total_numel()},                // what the chunks hold
          {"totals", totals},
          {"peak", peak},
          {"blocks", per_block},
          {"chunks", chunks},
          {"events", timeline},
          {"tiers", tiers}};
}

std::string memory_profile_table(const json& p) {
  std::ostringstream out;
  auto hb = [](const json& v) { return human_bytes(v.get<double>()); };
  out << "memory profile: " << p["title"].get<std::string>() << "\n";
  char line[256];
  std::snprintf(line, sizeof line, "%-8s %12s %12s %12s %12s %12s %12s %12s\n", "block", "params", "grads", "optimizer", "nvme", "activations",
                "fwd peak", "bwd peak");
  out << line;
  for (const auto& b : p["blocks"]) {
    const std::string name = b["block"].is_string() ? b["block"].get<std::string>() : std::to_string(b["block"].get<int64_t>());
    const bool in_block = b.contains("activations");
    std::snprintf(line, sizeof line, "%-8s %12s %12s %12s %12s %12s %12s %12s\n", name.c_str(), hb(b["params"]).c_str(), hb(b["grads"]).c_str(),
                  hb(b["optimizer"]).c_str(), hb(b["nvme"]).c_str(), in_block ? hb(b["activations"]).c_str() : "",
                  in_block ? hb(b["forward_peak"]).c_str() : "", in_block ? hb(b["backward_peak"]).c_str() : "");
    out << line;
  }
  const auto& t = p["totals"];
  out << "chunk store: " << hb(t["params"]) << " parameters, " << hb(t["grads"]) << " gradients, " << hb(t["optimizer"])
      << " optimizer states" << (t["staging"].get<int64_t>() > 0 ? " (" + hb(t["staging"]) + " of them staging)" : "")
      << (t["host"].get<int64_t>() > t["staging"].get<int64_t>()
              ? "; " + human_bytes(t["host"].get<double>() - t["staging"].get<double>()) + " of it in host memory (placement)"
              : "")
      << (t["nvme"].get<int64_t>() > 0 ? ", " + hb(t["nvme"]) + " on NVMe" : "") << "\n";
  if (!p["peak"].empty()) out << "step peak: " << hb(p["peak"]["bytes"]) << " live, during " << p["peak"]["where"].get<std::string>() << "\n";
  return out.str();
}

std::string memory_profile_html(const json& p) {
  const auto& events = p["events"];
  const size_t n = events.size();
  // Plot 1: memory by kind at each event (stacked: parameters, gradients, optimizer states, other),
  // with the peak of each interval as a line. x: event index; y: MiB.
  const double W = 960, H = 320, L = 70, R = 20, T = 20, B = 40;
  double top = 1;
  for (const auto& e : events) {   // the stack's height (the store's bytes and the rest) or the peak line
    const auto& h = e["held"];
    const double stack = h["params"].get<double>() + h["grads"].get<double>() + h["optimizer"].get<double>() + e["other"].get<double>();
    top = std::max(top, std::max(e["peak"].get<double>(), stack) / 1048576.0);
  }
  top *= 1.05;
  auto x_of = [&](size_t i) { return L + (n > 1 ? static_cast<double>(i) / static_cast<double>(n - 1) : 0.5) * (W - L - R); };
  auto y_of = [&](double mib) { return T + (1 - mib / top) * (H - T - B); };
  const char* kinds[] = {"params", "grads", "optimizer", "other"};
  const char* colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"};
  const char* labels[] = {"parameters", "gradients", "optimizer states", "activations and workspace"};
  std::ostringstream svg;
  svg << "<svg id=\"memory\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H << "\" viewBox=\"0 0 " << W << " " << H
      << "\">\n";
  std::vector<double> below(n, 0);
  for (int k = 0; k < 4; ++k) {
    std::ostringstream d;
    std::vector<double> above(n);
    for (size_t i = 0; i < n; ++i) {
      const auto& e = events[i];
      const double v = (k == 3 ? e["other"].get<double>() : e["held"][kinds[k]].get<double>()) / 1048576.0;
      above[i] = below[i] + v;
      d << (i == 0 ? "M" : "L") << num(x_of(i)) << "," << num(y_of(above[i])) << " ";
    }
    for (size_t i = n; i-- > 0;) d << "L" << num(x_of(i)) << "," << num(y_of(below[i])) << " ";
    if (n > 0) svg << "<path class=\"area\" d=\"" << d.str() << "Z\" fill=\"" << colors[k] << "\" fill-opacity=\"0.8\"><title>" << labels[k]
                   << "</title></path>\n";
    below = above;
  }
  std::ostringstream peak;
  for (size_t i = 0; i < n; ++i) peak << (i == 0 ? "M" : "L") << num(x_of(i)) << "," << num(y_of(events[i]["peak"].get<double>() / 1048576.0)) << " ";
  if (n > 0) svg << "<path class=\"line\" d=\"" << peak.str() << "\" fill=\"none\" stroke=\"#e15759\" stroke-width=\"1.5\"><title>peak since the previous event</title></path>\n";
  for (int g = 0; g <= 4; ++g) {   // y axis: five gridlines
    const double mib = top * g / 4;
    svg << "<line x1=\"" << L << "\" x2=\"" << W - R << "\" y1=\"" << num(y_of(mib)) << "\" y2=\"" << num(y_of(mib))
        << "\" stroke=\"#ddd\"/><text x=\"" << L - 6 << "\" y=\"" << num(y_of(mib) + 4) << "\" text-anchor=\"end\" font-size=\"11\">"
        << num(mib) << "</text>\n";
  }
  svg << "<text x=\"14\" y=\"" << H / 2 << "\" font-size=\"12\" transform=\"rotate(-90 14 " << H / 2 << ")\" text-anchor=\"middle\">MiB</text>\n";
  // x axis: where each phase starts; a label too close to the one before it goes one line lower.
  double last_label = -1e9;
  int row = 0;
  for (size_t i = 0; i < n; ++i) {
    const auto& e = events[i];
    if (e["block"].get<int64_t>() >= 0) continue;
    row = x_of(i) - last_label < 80 ? row + 1 : 0;
    last_label = x_of(i);
    svg << "<line x1=\"" << num(x_of(i)) << "\" x2=\"" << num(x_of(i)) << "\" y1=\"" << T << "\" y2=\"" << H - B << "\" stroke=\"#888\" stroke-dasharray=\"3,3\"/>"
        << "<text x=\"" << num(x_of(i) + 3) << "\" y=\"" << H - B + 14 + 12 * row << "\" font-size=\"11\"" << (i + 1 == n ? " text-anchor=\"end\"" : "")
        << ">" << escape(e["phase"].get<std::string>()) << "</text>\n";
  }
  svg << "</svg>\n";
  // Plot 2: where each chunk was at each event (rows: chunks; columns: events).
  const size_t chunks = p["chunks"].size();
  const double cell_h = std::max(3.0, std::min(14.0, 400.0 / static_cast<double>(std::max<size_t>(chunks, 1))));
  const double H2 = T + cell_h * static_cast<double>(chunks) + B;
  const double cell_w = (W - L - R) / static_cast<double>(std::max<size_t>(n, 1));
  std::ostringstream grid;
  grid << "<svg id=\"chunks\" xmlns=\"http://www.w3.org/2000/svg\" width=\"" << W << "\" height=\"" << H2 << "\" viewBox=\"0 0 " << W << " " << H2
       << "\">\n";
  std::map<char, std::string> tier_color;
  for (const auto& t : kTiers) tier_color[t.letter] = t.color;
  for (size_t c = 0; c < chunks; ++c) {
    // Runs of one tier become one rectangle.
    size_t from = 0;
    for (size_t i = 1; i <= n; ++i) {
      const char tier = events[from]["tiers"].get<std::string>()[c];
      if (i < n && events[i]["tiers"].get<std::string>()[c] == tier) continue;
      grid << "<rect class=\"cell\" x=\"" << num(L + cell_w * static_cast<double>(from)) << "\" y=\"" << num(T + cell_h * static_cast<double>(c))
           << "\" width=\"" << num(cell_w * static_cast<double>(i - from)) << "\" height=\"" << num(cell_h * 0.9) << "\" fill=\""
           << tier_color.at(tier) << "\"><title>chunk " << c << ": " << p["tiers"][std::string(1, tier)].get<std::string>() << "</title></rect>\n";
      from = i;
    }
    if (chunks <= 40 || c % 10 == 0)
      grid << "<text x=\"" << L - 6 << "\" y=\"" << num(T + cell_h * (static_cast<double>(c) + 0.8)) << "\" text-anchor=\"end\" font-size=\""
           << std::min(11.0, cell_h + 2) << "\">" << c << "</text>\n";
  }
  grid << "<text x=\"" << L << "\" y=\"" << H2 - 12 << "\" font-size=\"11\">events of the step, left to right (as above); rows: chunks</text>\n";
  grid << "</svg>\n";

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>colossal profile: " << escape(p["title"].get<std::string>())
       << "</title>\n<style>body{font-family:sans-serif;margin:24px;color:#222}table{border-collapse:collapse;font-size:13px}"
          "td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}pre{overflow-x:auto}th{background:#f4f4f4}.key span{display:inline-block;width:12px;"
          "height:12px;margin:0 4px 0 12px;vertical-align:middle}</style></head>\n<body>\n<h1>colossal profile</h1>\n<p>"
       << escape(p["title"].get<std::string>()) << "</p>\n<pre>" << escape(memory_profile_table(p)) << "</pre>\n";
  html << "<h2>Memory over the step</h2>\n<p class=\"key\">";
  for (int k = 0; k < 4; ++k) html << "<span style=\"background:" << colors[k] << "\"></span>" << labels[k];
  html << "<span style=\"background:#e15759\"></span>peak since the previous event</p>\n" << svg.str();
  html << "<h2>Where each chunk lived</h2>\n<p class=\"key\">";
  for (const auto& t : kTiers) html << "<span style=\"background:" << t.color << "\"></span>" << t.meaning;
  html << "</p>\n" << grid.str();
  html << "<h2>Per block</h2>\n<table><tr><th>block</th><th>elements</th><th>parameters</th><th>gradients</th><th>optimizer</th><th>NVMe</th>"
          "<th>activations kept</th><th>forward peak</th><th>backward peak</th></tr>\n";
  auto cell = [](const json& b, const char* key) { return b.contains(key) ? human_bytes(b[key].get<double>()) : std::string(); };
  for (const auto& b : p["blocks"]) {
    html << "<tr><td>" << (b["block"].is_string() ? b["block"].get<std::string>() : std::to_string(b["block"].get<int64_t>())) << "</td><td>"
         << b["elements"].get<int64_t>() << "</td>";
    for (const char* key : {"params", "grads", "optimizer", "nvme", "activations", "forward_peak", "backward_peak"}) html << "<td>" << cell(b, key) << "</td>";
    html << "</tr>\n";
  }
  html << "</table>\n";
  // After layout, the page writes each plot's drawn extent into <body data-rendered>: what a headless
  // browser's dumped DOM shows when the plots have size.
  html << "<script>window.addEventListener('load',function(){var r=[];document.querySelectorAll('svg').forEach(function(s){"
          "var n=0;s.querySelectorAll('path,rect').forEach(function(e){var b=e.getBBox();if(b.width>0&&b.height>0)n++;});"
          "r.push(s.id+':'+n);});document.body.setAttribute('data-rendered',r.join(' '));});</script>\n";
  html << "</body></html>\n";
  return html.str();
}

}  // namespace colossal
