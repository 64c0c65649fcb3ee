// Recipe parsing and validation: see recipe.h. Section parsers read every key they know (with
// defaults and ranges), then cross-section checks run on the typed values.
#include "src/core/recipe.h"

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "src/core/recipe_table.h"
#include "src/core/text.h"
#include "src/core/toml.h"

namespace colossal {
namespace {

constexpr int64_t kBig = INT64_MAX;

// The offset of the first byte >= 0x80 outside a quoted string or a comment, or npos. TOML allows
// non-ASCII text only there; a recipe with one elsewhere is refused with this plainer message than
// TOML++'s. (TOML++'s own undefined behaviour on such characters is handled in src/core/toml.h.)
size_t bare_non_ascii_at(const std::string& text) {
  const size_t n = text.size();
  for (size_t i = 0; i < n;) {
    const char c = text[i];
    if (static_cast<unsigned char>(c) >= 0x80) return i;
    if (c == '#') {   // comment: to the end of the line
      while (i < n && text[i] != '\n') ++i;
    } else if (c == '"' || c == '\'') {
      const bool multi = text.compare(i, 3, std::string(3, c)) == 0;
      i += multi ? 3 : 1;
      while (i < n) {
        if (c == '"' && text[i] == '\\') {   // basic strings escape; literal strings do not
          i += 2;
          continue;
        }
        if (multi ? text.compare(i, 3, std::string(3, c)) == 0 : (text[i] == c || text[i] == '\n')) break;
        ++i;
      }
      i += multi ? 3 : 1;
    } else {
      ++i;
    }
  }
  return std::string::npos;
}

// "optim.lr=1e-4" -> sets table["optim"]["lr"] = 1e-4. The value is read as TOML, or as a bare
// string when it is not valid TOML (so --set data.text=my.txt works without quotes).
void apply_override(toml::table& root, const std::string& spec, std::set<std::string>& overridden) {
  auto eq = spec.find('=');
  if (eq == std::string::npos || eq == 0)
    throw RecipeError("--set " + spec, "expected section.key=value (e.g. --set optim.lr=1e-4)");
  std::string key = spec.substr(0, eq), text = spec.substr(eq + 1);
  auto dot = key.find('.');
  std::string section = dot == std::string::npos ? "" : key.substr(0, dot);
  std::string leaf = dot == std::string::npos ? key : key.substr(dot + 1);
  if (leaf.empty() || leaf.find('.') != std::string::npos)
    throw RecipeError("--set " + spec, "expected section.key=value with one dot (e.g. optim.lr=1e-4)");
  toml::table* target = &root;
  if (!section.empty()) {
    if (!root.contains(section)) root.insert(section, toml::table{});
    target = root[section].as_table();
    if (!target) throw RecipeError("--set " + key, "\"" + section + "\" is not a section");
  }
  // One value per --set: a line break would let the rest of the text parse as further keys, which
  // were silently dropped; any other control character has no place in a value either.
  if (const size_t i = control_char_at(text); i != std::string::npos)
    throw RecipeError("--set " + key, "the value contains a control character (byte " +
                                          std::to_string(static_cast<unsigned char>(text[i])) + " at offset " +
                                          std::to_string(i) + "); give one value per --set");
  target->erase(leaf);
  try {
    toml::table parsed = toml::parse("v = " + text);
    if (parsed.size() != 1) throw RecipeError("--set " + key, "the value must be one TOML value");
    target->insert(leaf, *parsed.get("v"));
  } catch (const toml::parse_error&) {
    target->insert(leaf, text);
  }
  overridden.insert(key);
}

std::string divisors_near(int64_t n, int64_t near) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  std::sort(d.begin(), d.end(), [&](int64_t a, int64_t b) { return std::llabs(a - near) < std::llabs(b - near); });
  d.resize(std::min<size_t>(3, d.size()));
  std::sort(d.begin(), d.end());
  std::vector<std::string> s;
  for (auto v : d) s.push_back(std::to_string(v));
  if (s.size() < 2) return join(s, ", ");
  std::string last = s.back();
  s.pop_back();
  return join(s, ", ") + " or " + last;
}

}  // namespace

std::string Recipe::where(const std::string& dotted_key) const {
  auto it = locations.find(dotted_key);
  if (it != locations.end()) return it->second;
  auto dot = dotted_key.find('.');
  return path + ": [" + dotted_key.substr(0, dot) + "] " + dotted_key.substr(dot + 1);
}

Recipe parse_recipe(const std::string& toml_text, const std::string& path,
                    const std::vector<std::string>& overrides) {
  toml::table root;
  if (const size_t at = bare_non_ascii_at(toml_text); at != std::string::npos)
    throw RecipeError(path + ":" + std::to_string(1 + std::count(toml_text.begin(), toml_text.begin() + static_cast<std::ptrdiff_t>(at), '\n')),
                      "invalid TOML: a non-ASCII character outside a quoted string or comment (keys and bare values are ASCII; "
                      "put text in quotes)");
  try {
    root = toml::parse(toml_text, path);
  } catch (const toml::parse_error& e) {
    throw RecipeError(path + ":" + std::to_string(e.source().begin.line),
                      "invalid TOML: " + std::string(e.description()));
  }
  std::set<std::string> overridden;
  for (const auto& o : overrides) apply_override(root, o, overridden);

  Recipe r;
  r.path = path;
  for (const auto& [k, node] : root)
    if (node.is_table()) r.sections.insert(std::string(k.str()));
  auto section = [&](const std::string& name) {
    const toml::node* n = root.get(name);
    if (n && !n->is_table())
      throw RecipeError(path + ":" + std::to_string(n->source().begin.line), "\"" + name + "\" must be a [section]");
    return RecipeSection(n ? n->as_table() : nullptr, path, name, &overridden, &r.locations);
  };

  RecipeSection top(&root, path, "", &overridden, &r.locations);
  r.name = top.string("name", std::filesystem::path(path).stem().string());
  // The name becomes a directory under runs/: one plain path component.
  if (r.name.empty() || r.name == "." || r.name == ".." || r.name.find('/') != std::string::npos)
    throw RecipeError(r.where("name"), "= \"" + r.name + "\" is not a usable run name (non-empty, no \"/\", not . or ..)");
  top.finish();
  static const std::vector<std::string> kSections = {"model", "data", "train", "optim", "checkpoint", "finetune", "kernels", "parallel", "memory", "precision", "output"};
  for (const auto& [k, node] : root) {
    std::string key(k.str());
    if (!node.is_table() || std::find(kSections.begin(), kSections.end(), key) != kSections.end()) continue;
    std::string hint = nearest_name(key, kSections);
    std::string at = path + ":" + std::to_string(node.source().begin.line);
    for (const auto& o : overridden)   // a section only a --set created is reported there
      if (node.source().begin.line == 0 && o.rfind(key + ".", 0) == 0) at = "--set " + o;
    throw RecipeError(at,
                      "unknown section [" + key + "]" + (hint.empty() ? " (valid: " + join(kSections, ", ") + ")"
                                                                      : " (did you mean [" + hint + "]?)"));
  }

  auto m = section("model");
  ModelConfig& mc = r.model;
  mc.from = m.string("from", mc.from);
  mc.family = m.string("family", mc.family);
  mc.n_layer = m.integer("n_layer", mc.n_layer, 1, 1024);
  mc.n_head = m.integer("n_head", mc.n_head, 1, 1024);
  mc.n_embd = m.integer("n_embd", mc.n_embd, 1, 1 << 20);
  mc.block_size = m.integer("block_size", mc.block_size, 1, 1 << 20);
  mc.vocab_size = m.integer("vocab_size", mc.vocab_size, 8, 1 << 24);
  mc.dropout = m.real("dropout", mc.dropout, 0.0, 0.99);
  mc.attn_dropout = m.real("attn_dropout", mc.attn_dropout, -1, 0.99);
  if (mc.attn_dropout < 0 && mc.attn_dropout != -1)
    m.fail("attn_dropout", "= " + format_number(mc.attn_dropout) + " is out of range (valid: 0 to 0.99, or -1 for the dropout rate)");
  mc.bias = m.boolean("bias", mc.bias);
  mc.layer_norm_eps = m.real("layer_norm_eps", mc.layer_norm_eps, 1e-12, 1e-1);
  mc.init_std = m.real("init_std", mc.init_std, 1e-6, 1.0);
  mc.n_inner = m.integer("n_inner", mc.n_inner, 0, 1 << 22);
  mc.activation = m.string("activation", mc.activation, {"auto", "gelu_tanh", "gelu", "relu"});
  mc.pre_norm = m.boolean("pre_norm", mc.pre_norm);
  mc.embed_dim = m.integer("embed_dim", mc.embed_dim, 0, 1 << 20);
  mc.head = m.string("head", mc.head, {"auto", "mlm", "classifier"});
  mc.num_labels = m.integer("num_labels", mc.num_labels, 1, 1 << 20);
  mc.type_vocab_size = m.integer("type_vocab_size", mc.type_vocab_size, 1, 1 << 10);
  mc.image_size = m.integer("image_size", mc.image_size, 1, 1 << 14);
  mc.patch_size = m.integer("patch_size", mc.patch_size, 1, 1 << 14);
  mc.channels = m.integer("channels", mc.channels, 1, 64);
  if (mc.n_embd % mc.n_head != 0)
    m.fail("n_head", "= " + std::to_string(mc.n_head) + " does not divide n_embd = " + std::to_string(mc.n_embd) +
                         " (try " + divisors_near(mc.n_embd, mc.n_head) + ")");
  m.finish();

  auto d = section("data");
  DataConfig& dc = r.data;
  dc.text = d.string("text", dc.text);
  dc.tokenizer = d.string("tokenizer", dc.tokenizer);
  dc.dataset = d.string("dataset", dc.dataset);
  dc.tokenizer_vocab = d.integer("tokenizer_vocab", dc.tokenizer_vocab, 0, 1 << 24);
  dc.val_fraction = d.real("val_fraction", dc.val_fraction, 0.0, 0.5);
  dc.prefetch = d.integer("prefetch", dc.prefetch, 1, 64);
  // With [model] from, the model's sizes are known only once the directory is read (the trainer
  // checks these there).
  if (mc.from.empty() && dc.tokenizer_vocab > mc.vocab_size)
    d.fail("tokenizer_vocab", "= " + std::to_string(dc.tokenizer_vocab) + " exceeds model.vocab_size = " +
                                  std::to_string(mc.vocab_size) + " (the model must have a row for every token)");
  // A trained tokenizer starts from 256 byte-fallback pieces, <unk>, <s>, </s> and the newline piece.
  constexpr int64_t kMinTrainedVocab = 260;
  if (dc.tokenizer_vocab != 0 && dc.tokenizer_vocab < kMinTrainedVocab)
    d.fail("tokenizer_vocab", "= " + std::to_string(dc.tokenizer_vocab) + " is below the " + std::to_string(kMinTrainedVocab) +
                                  " pieces every trained tokenizer needs (256 byte-fallback pieces, <unk>, <s>, </s> and the "
                                  "newline); valid: 0 (= model.vocab_size) or at least " + std::to_string(kMinTrainedVocab));
  if (dc.tokenizer_vocab == 0) dc.tokenizer_vocab = mc.vocab_size;
  d.finish();

  auto t = section("train");
  TrainConfig& tc = r.train;
  tc.batch_size = t.integer("batch_size", tc.batch_size, 1, 1 << 20);
  tc.grad_accum = t.integer("grad_accum", tc.grad_accum, 1, 1 << 20);
  tc.seq_len = t.integer("seq_len", tc.seq_len, 0, 1 << 20);
  tc.max_steps = t.integer("max_steps", tc.max_steps, 1, kBig);
  tc.time_limit_min = t.real("time_limit_min", tc.time_limit_min, 0, 1e7);
  tc.eval_every = t.integer("eval_every", tc.eval_every, 0, kBig);
  tc.eval_batches = t.integer("eval_batches", tc.eval_batches, 1, 1 << 20);
  tc.log_every = t.integer("log_every", tc.log_every, 1, kBig);
  tc.seed = t.integer("seed", tc.seed, 0, kBig);
  tc.device = t.string("device", tc.device, {"auto", "cpu", "cuda"});
  tc.grad_clip = t.real("grad_clip", tc.grad_clip, 0, 1e9);
  if (tc.seq_len == 0 && mc.from.empty()) tc.seq_len = mc.block_size;
  if (mc.from.empty() && tc.seq_len > mc.block_size)
    t.fail("seq_len", "= " + std::to_string(tc.seq_len) + " exceeds model.block_size = " +
                          std::to_string(mc.block_size) + " (the model has no position beyond its context)");
  t.finish();

  auto o = section("optim");
  OptimConfig& oc = r.optim;
  oc.name = o.string("name", oc.name, {"adamw", "lamb", "lars", "lion", "sgd"});
  oc.lr = o.real("lr", oc.lr, 1e-12, 10);
  oc.min_lr = o.real("min_lr", std::min(oc.min_lr, oc.lr), 0, 10);
  oc.weight_decay = o.real("weight_decay", oc.weight_decay, 0, 10);
  auto betas = o.reals("betas", {oc.betas[0], oc.betas[1]}, 0.0, 0.999999);
  oc.betas = {betas[0], betas[1]};
  oc.eps = o.real("eps", oc.eps, 1e-30, 1);
  oc.momentum = o.real("momentum", oc.momentum, 0, 0.999999);
  oc.nesterov = o.boolean("nesterov", oc.nesterov);
  if (oc.nesterov && oc.momentum == 0) o.fail("nesterov", "= true needs momentum > 0 (Nesterov's look-ahead is along the momentum)");
  oc.trust_coefficient = o.real("trust_coefficient", oc.trust_coefficient, 1e-12, 1);
  oc.warmup_steps = o.integer("warmup_steps", std::min(oc.warmup_steps, tc.max_steps), 0, kBig);
  oc.schedule = o.string("schedule", oc.schedule, {"cosine", "linear", "constant"});
  oc.decay_steps = o.integer("decay_steps", oc.decay_steps, 0, kBig);
  if (oc.min_lr > oc.lr) o.fail("min_lr", "must not exceed lr");
  if (oc.decay_steps == 0) oc.decay_steps = tc.max_steps;
  if (oc.warmup_steps > oc.decay_steps)
    o.fail("warmup_steps", "= " + std::to_string(oc.warmup_steps) + " exceeds the decay horizon of " +
                               std::to_string(oc.decay_steps) + " steps");
  o.finish();

  auto c = section("checkpoint");
  CheckpointConfig& cc = r.checkpoint;
  cc.dir = c.string("dir", cc.dir);
  cc.every = c.integer("every", cc.every, 0, kBig);
  cc.keep_last = c.integer("keep_last", cc.keep_last, 1, 1000);
  cc.at_end = c.boolean("at_end", cc.at_end);
  c.finish();

  auto f = section("finetune");
  r.finetune.from = f.string("from", r.finetune.from);
  f.finish();

  auto k = section("kernels");
  r.kernels.attention = k.string("attention", r.kernels.attention, {"auto", "fused", "aten"});
  r.kernels.gelu = k.string("gelu", r.kernels.gelu, {"auto", "fused", "aten"});
  r.kernels.gemv = k.string("gemv", r.kernels.gemv, {"auto", "fused", "aten"});
  r.kernels.layer_norm = k.string("layer_norm", r.kernels.layer_norm, {"auto", "fused", "aten"});
  r.kernels.gemm = k.string("gemm", r.kernels.gemm, {"auto", "fused", "aten"});
  k.finish();

  auto par = section("parallel");
  ParallelConfig& pc = r.parallel;
  pc.data = par.integer_or_word("data", pc.data, 1, 1 << 20, "auto", 0);
  pc.tensor = par.integer("tensor", pc.tensor, 1, 1 << 20);
  pc.tensor_mode = par.string("tensor_mode", pc.tensor_mode, {"1d", "2d", "2.5d", "3d"});
  pc.tensor_depth = par.integer("tensor_depth", pc.tensor_depth, 1, 1 << 20);
  pc.pipeline = par.integer("pipeline", pc.pipeline, 1, 1 << 20);
  pc.schedule = par.string("schedule", pc.schedule, {"gpipe", "1f1b", "interleaved", "zero_bubble"});
  pc.virtual_stages = par.integer("virtual_stages", pc.virtual_stages, 1, 1 << 20);
  pc.micro_batches = par.integer_or_word("micro_batches", pc.micro_batches, 1, 1 << 20, "auto", 0);
  pc.partition = par.string("partition", pc.partition, {"uniform", "parameters", "profile"});
  if (pc.virtual_stages > 1 && pc.schedule != "interleaved")
    par.fail("virtual_stages", "= " + std::to_string(pc.virtual_stages) + " needs schedule = \"interleaved\" (schedule = \"" + pc.schedule +
                                   "\" runs one chunk of blocks a rank)");
  pc.sequence = par.integer("sequence", pc.sequence, 1, 1 << 20);
  pc.sequence_mode = par.string("sequence_mode", pc.sequence_mode, {"split_gather", "ring", "all_to_all"});
  pc.tensor_sequence = par.boolean("tensor_sequence", pc.tensor_sequence);
  if (par.real("bucket_mb", -1, 0, 1e300) >= 0)
    par.fail("bucket_mb", "was replaced by [memory] chunk_size_mb: gradients are reduced a chunk at a time (remove the key, "
                          "or set chunk_size_mb = N in MiB)");
  pc.timeout_s = par.real("timeout_s", pc.timeout_s, 1, 1e6);
  pc.backend = par.string("backend", pc.backend, {"auto", "gloo", "nccl"});
  par.finish();

  auto mem = section("memory");
  r.memory.zero = mem.integer("zero", r.memory.zero, 0, 3);
  r.memory.chunk_size_mb = mem.real_or_word("chunk_size_mb", r.memory.chunk_size_mb, 1.0 / 1024, 1 << 20, "auto", 0);
  r.memory.offload_optimizer = mem.string("offload_optimizer", r.memory.offload_optimizer, {"none", "cpu", "nvme"});
  r.memory.nvme_path = mem.string("nvme_path", r.memory.nvme_path);
  if (r.memory.offload_optimizer == "nvme" && r.memory.nvme_path.empty())
    mem.fail("offload_optimizer", "= \"nvme\" needs nvme_path, a directory on a local disk (e.g. nvme_path = \"/mnt/nvme\")");
  // Keys whose setting only ZeRO-3 can carry out: `what` says why.
  auto needs_zero3 = [&](bool set, const char* key, const std::string& setting, const std::string& what) {
    if (set && r.memory.zero != 3)
      mem.fail(key, setting + "needs zero = 3: " + what + " (zero = " + std::to_string(r.memory.zero) + ")");
  };
  r.memory.offload_params = mem.string("offload_params", r.memory.offload_params, {"none", "cpu", "nvme"});
  needs_zero3(r.memory.offload_params != "none", "offload_params", "= \"" + r.memory.offload_params + "\" ",
              "a block's parameters are brought in as it runs, which only ZeRO-3 does");
  if (r.memory.offload_params == "nvme" && r.memory.offload_optimizer != "nvme")
    mem.fail("offload_params", "= \"nvme\" keeps the parameters in the optimizer states' file, as their master copy: set "
                               "offload_optimizer = \"nvme\" too");
  r.memory.placement = mem.string("placement", r.memory.placement, {"device", "cpu", "auto"});
  needs_zero3(r.memory.placement == "cpu", "placement", "= \"cpu\" ",
              "chunks are brought to the device block by block, which only ZeRO-3 does");
  r.memory.device_memory_limit_gb = mem.real("device_memory_limit_gb", r.memory.device_memory_limit_gb, 0, 1 << 20);
  needs_zero3(r.memory.device_memory_limit_gb > 0, "device_memory_limit_gb", "",
              "below it the device holds every parameter, gradient and state, as the dry run counts them");
  r.memory.host_memory_limit_gb = mem.real("host_memory_limit_gb", r.memory.host_memory_limit_gb, 0, 1 << 20);
  r.memory.overlap_update = mem.string("overlap_update", r.memory.overlap_update, {"auto", "on", "off"});
  needs_zero3(r.memory.overlap_update == "on", "overlap_update", "= \"on\" ",
              "the next forward waits for each chunk's update as its block gathers it, which only ZeRO-3 does");
  r.memory.activation_checkpoint = mem.string("activation_checkpoint", r.memory.activation_checkpoint, {"none", "full", "every_n", "auto"});
  r.memory.activation_memory_gb = mem.real("activation_memory_gb", r.memory.activation_memory_gb, 0, 1e9);
  if (r.memory.activation_checkpoint == "auto" && r.memory.activation_memory_gb <= 0)
    mem.fail("activation_checkpoint", "= \"auto\" needs activation_memory_gb, the most the blocks' activations of a micro-batch may hold "
                                      "(e.g. activation_memory_gb = 2)");
  r.memory.checkpoint_every = mem.integer("checkpoint_every", r.memory.checkpoint_every, 1, 1 << 20);
  mem.finish();

  auto pr = section("precision");
  PrecisionConfig& pc2 = r.precision;
  pc2.dtype = pr.string("dtype", pc2.dtype, {"fp32", "bf16", "fp16"});
  pc2.initial_scale = pr.real("initial_scale", pc2.initial_scale, 1e-30, 1e30);
  pc2.growth_factor = pr.real("growth_factor", pc2.growth_factor, 0, 1e6);
  if (pc2.growth_factor <= 1)
    pr.fail("growth_factor", "= " + format_number(pc2.growth_factor) + " would never let the scale grow (valid: above 1, e.g. 2)");
  pc2.backoff_factor = pr.real("backoff_factor", pc2.backoff_factor, 0, 1e6);
  if (pc2.backoff_factor <= 0 || pc2.backoff_factor >= 1)
    pr.fail("backoff_factor", "= " + format_number(pc2.backoff_factor) + " would not shrink the scale after an overflow (valid: between 0 and 1, e.g. 0.5)");
  pc2.growth_interval = pr.integer("growth_interval", pc2.growth_interval, 1, kBig);
  pr.finish();

  auto out = section("output");
  r.output.dir = out.string("dir", "runs/" + r.name);
  r.output.log_level = out.string("log_level", r.output.log_level, {"trace", "debug", "info", "warn", "error"});
  out.finish();
  if (cc.dir.empty()) cc.dir = r.output.dir + "/checkpoints";
  return r;
}

Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec))
    throw Error("recipe " + path + ": is a directory, not a TOML file (e.g. recipes/gpt-mini.toml)");
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::error_code ec;
    bool exists = std::filesystem::exists(path, ec);
    throw Error("recipe " + path + (exists ? ": cannot be read" : ": no such file") +
                " (recipes/ holds the shipped ones, e.g. recipes/gpt-mini.toml)");
  }
  std::stringstream buf;
  buf << in.rdbuf();
  if (buf.str().find_first_not_of(" \t\r\n") == std::string::npos)
    throw Error("recipe " + path + ": is empty (a recipe names at least its [model] and [data]; see recipes/gpt-mini.toml)");
  return parse_recipe(buf.str(), path, overrides);
}

std::string Recipe::to_toml() const {
  toml::table root{
      {"name", name},
      {"model", toml::table{{"from", model.from}, {"family", model.family}, {"n_layer", model.n_layer}, {"n_head", model.n_head},
                            {"n_embd", model.n_embd}, {"block_size", model.block_size},
                            {"vocab_size", model.vocab_size}, {"dropout", model.dropout},
                            {"attn_dropout", model.attn_dropout}, {"bias", model.bias},
                            {"layer_norm_eps", model.layer_norm_eps}, {"init_std", model.init_std},
                            {"n_inner", model.n_inner}, {"activation", model.activation},
                            {"pre_norm", model.pre_norm}, {"embed_dim", model.embed_dim},
                            {"head", model.head}, {"num_labels", model.num_labels},
                            {"type_vocab_size", model.type_vocab_size}, {"image_size", model.image_size},
                            {"patch_size", model.patch_size}, {"channels", model.channels}}},
      {"data", toml::table{{"text", data.text}, {"tokenizer", data.tokenizer}, {"dataset", data.dataset},
                           {"tokenizer_vocab", data.tokenizer_vocab}, {"val_fraction", data.val_fraction},
                           {"prefetch", data.prefetch}}},
      {"train", toml::table{{"batch_size", train.batch_size}, {"grad_accum", train.grad_accum},
                            {"seq_len", train.seq_len}, {"max_steps", train.max_steps},
                            {"time_limit_min", train.time_limit_min}, {"eval_every", train.eval_every},
                            {"eval_batches", train.eval_batches}, {"log_every", train.log_every},
                            {"seed", train.seed}, {"device", train.device}, {"grad_clip", train.grad_clip}}},
      {"optim", toml::table{{"name", optim.name}, {"lr", optim.lr}, {"min_lr", optim.min_lr},
                            {"weight_decay", optim.weight_decay}, {"eps", optim.eps}, {"momentum", optim.momentum},
                            {"nesterov", optim.nesterov}, {"trust_coefficient", optim.trust_coefficient}, {"warmup_steps", optim.warmup_steps},
                            {"schedule", optim.schedule}, {"decay_steps", optim.decay_steps}}},
      {"checkpoint", toml::table{{"dir", checkpoint.dir}, {"every", checkpoint.every}, {"keep_last", checkpoint.keep_last},
                                 {"at_end", checkpoint.at_end}}},
      {"finetune", toml::table{{"from", finetune.from}}},
      {"kernels", toml::table{{"attention", kernels.attention}, {"gelu", kernels.gelu}, {"gemv", kernels.gemv},
                              {"layer_norm", kernels.layer_norm}, {"gemm", kernels.gemm}}},
      {"parallel", toml::table{{"tensor", parallel.tensor}, {"tensor_mode", parallel.tensor_mode}, {"tensor_depth", parallel.tensor_depth},
                               {"pipeline", parallel.pipeline}, {"schedule", parallel.schedule},
                               {"virtual_stages", parallel.virtual_stages},
                               {"partition", parallel.partition}, {"sequence", parallel.sequence}, {"sequence_mode", parallel.sequence_mode},
                               {"tensor_sequence", parallel.tensor_sequence},
                               {"timeout_s", parallel.timeout_s}, {"backend", parallel.backend}}},
      {"memory", toml::table{{"zero", memory.zero}, {"offload_optimizer", memory.offload_optimizer},
                                 {"offload_params", memory.offload_params}, {"nvme_path", memory.nvme_path},
                                 {"placement", memory.placement}, {"device_memory_limit_gb", memory.device_memory_limit_gb},
                                 {"host_memory_limit_gb", memory.host_memory_limit_gb}, {"overlap_update", memory.overlap_update},
                                 {"activation_checkpoint", memory.activation_checkpoint}, {"checkpoint_every", memory.checkpoint_every},
                                 {"activation_memory_gb", memory.activation_memory_gb}}},
      {"precision", toml::table{{"dtype", precision.dtype}, {"initial_scale", precision.initial_scale},
                                {"growth_factor", precision.growth_factor}, {"backoff_factor", precision.backoff_factor},
                                {"growth_interval", precision.growth_interval}}},
      {"output", toml::table{{"dir", output.dir}, {"log_level", output.log_level}}},
  };
  if (memory.chunk_size_mb == 0) root["memory"].as_table()->insert("chunk_size_mb", "auto");
  else root["memory"].as_table()->insert("chunk_size_mb", memory.chunk_size_mb);
  if (parallel.data == 0) root["parallel"].as_table()->insert("data", "auto");
  else root["parallel"].as_table()->insert("data", parallel.data);
  if (parallel.micro_batches == 0) root["parallel"].as_table()->insert("micro_batches", "auto");
  else root["parallel"].as_table()->insert("micro_batches", parallel.micro_batches);
  std::ostringstream s;
  s << root << "\n";
  // TOML++ 3.3's formatter weighs an array's reals by static_cast<size_t>(log10(x)), undefined
  // behaviour for 0 < x < 0.1 (fuzz_recipe found betas = [0.8, 0.1]): the one array is written here.
  auto real = [](double x) {
    char buf[32];
    std::string t(buf, std::to_chars(buf, buf + sizeof buf, x).ptr);   // shortest text that reads back as x
    return t.find_first_of(".e") == std::string::npos ? t + ".0" : t;
  };
  std::string out = s.str();
  const std::string header = "[optim]\n";
  out.insert(out.find(header) + header.size(), "betas = [" + real(optim.betas[0]) + ", " + real(optim.betas[1]) + "]\n");
  return out;
}

}  // namespace colossal
