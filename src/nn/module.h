// Module: the parameter tree every layer and model is built of: named parameters and named child
// modules in registration order, and a training flag. Our own rather than torch::nn::Module, whose
// header (serialisation archives, the JIT, the whole of torch::nn) cost each translation unit that
// saw a layer about 7 s to parse, or 2 s a unit even precompiled; this one needs only at::Tensor.
// It keeps the parts of torch's interface the engine uses, with the same order and semantics:
// named_parameters() lists a module's own parameters first, then each child's, depth first.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "src/nn/shard.h"

namespace colossal::nn {

// One parameter and its dotted path from the module it was listed from ("blocks.0.attn.qkv.weight").
class NamedParameter {
 public:
  NamedParameter(std::string key, at::Tensor value, ShardSpec shard = {})
      : key_(std::move(key)), value_(std::move(value)), shard_(shard) {}
  const std::string& key() const { return key_; }
  // How this rank's value is a piece of the whole tensor (replicated unless a tensor-parallel layer said).
  const ShardSpec& shard() const { return shard_; }
  at::Tensor& value() { return value_; }
  const at::Tensor& value() const { return value_; }

 private:
  std::string key_;
  at::Tensor value_;   // shares the parameter's TensorImpl: in-place changes reach the module
  ShardSpec shard_;
};

// Parameters in listing order, by position or by name.
class NamedParameters {
 public:
  void push_back(NamedParameter p) { items_.push_back(std::move(p)); }
  size_t size() const { return items_.size(); }
  bool empty() const { return items_.empty(); }
  NamedParameter& operator[](size_t i) { return items_.at(i); }
  const NamedParameter& operator[](size_t i) const { return items_.at(i); }
  const at::Tensor& operator[](const std::string& key) const;   // throws std::out_of_range naming the key
  auto begin() { return items_.begin(); }
  auto end() { return items_.end(); }
  auto begin() const { return items_.begin(); }
  auto end() const { return items_.end(); }

 private:
  std::vector<NamedParameter> items_;
};

class Module {
 public:
  Module() = default;
  virtual ~Module() = default;
  Module(const Module&) = delete;   // parameters are shared handles: a copy would alias them silently
  Module& operator=(const Module&) = delete;

  // `value` becomes a parameter called `name` (no dots; unique among this module's parameters and
  // children). Returns the same handle, to keep as a member. `shard`: how a tensor-parallel layer's
  // value is a piece of the whole parameter.
  at::Tensor register_parameter(std::string name, at::Tensor value, bool requires_grad = true, ShardSpec shard = {});
  template <class M>
  std::shared_ptr<M> register_module(std::string name, std::shared_ptr<M> child) {
    add_child(std::move(name), child);
    return child;
  }

  NamedParameters named_parameters() const;   // own parameters, then each child's, depth first
  std::vector<at::Tensor> parameters() const;

  bool is_training() const { return training_; }
  void train(bool on = true);   // this module and every descendant
  void eval() { train(false); }

  // Moves or converts every parameter in place (set_data), so members, views held elsewhere and the
  // optimizer keep referring to the same parameters. A dtype applies to floating-point parameters only
  // (a quantized layer's integers keep theirs).
  void to(const c10::Device& device);
  void to(c10::ScalarType dtype);

 private:
  void add_child(std::string name, std::shared_ptr<Module> child);
  void check_new_name(const std::string& name) const;
  // Calls visit(prefix, name, tensor) for each defined parameter: own first, then each child's.
  using ParameterVisitor = std::function<void(const std::string&, const std::string&, const at::Tensor&, const ShardSpec&)>;
  void visit_parameters(const std::string& prefix, const ParameterVisitor& visit) const;

  struct Param {
    std::string name;
    at::Tensor value;
    ShardSpec shard;
  };
  std::vector<Param> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

// Children named "0", "1", ... in order (a model's blocks).
class ModuleList : public Module {
 public:
  void push_back(std::shared_ptr<Module> child) { register_module(std::to_string(size_++), std::move(child)); }
  size_t size() const { return size_; }

 private:
  size_t size_ = 0;
};

}  // namespace colossal::nn
