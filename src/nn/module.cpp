// Module: see module.h.
#include "src/nn/module.h"

#include "src/nn/factory.h"

#include <stdexcept>

namespace colossal::nn {

const at::Tensor& NamedParameters::operator[](const std::string& key) const {
  for (const auto& item : items_)
    if (item.key() == key) return item.value();
  throw std::out_of_range("no parameter named \"" + key + "\"");
}

void Module::check_new_name(const std::string& name) const {
  // A programming error in a model's constructor, not user input: std::invalid_argument.
  if (name.empty() || name.find('.') != std::string::npos)
    throw std::invalid_argument("module member name \"" + name + "\" must be non-empty and contain no '.'");
  for (const auto& p : params_)
    if (p.name == name) throw std::invalid_argument("parameter \"" + name + "\" is registered twice");
  for (const auto& [n, _] : children_)
    if (n == name) throw std::invalid_argument("child module \"" + name + "\" is registered twice");
}

at::Tensor Module::register_parameter(std::string name, at::Tensor value, bool requires_grad, ShardSpec shard) {
  check_new_name(name);
  if (value.defined()) value.set_requires_grad(requires_grad);
  params_.push_back({std::move(name), value, shard});
  return value;
}

void Module::add_child(std::string name, std::shared_ptr<Module> child) {
  check_new_name(name);
  if (!child) throw std::invalid_argument("child module \"" + name + "\" is null");
  children_.emplace_back(std::move(name), std::move(child));
}

void Module::visit_parameters(const std::string& prefix, const ParameterVisitor& visit) const {
  for (const auto& p : params_)
    if (p.value.defined()) visit(prefix, p.name, p.value, p.shard);
  for (const auto& [name, child] : children_) child->visit_parameters(prefix + name + ".", visit);
}

NamedParameters Module::named_parameters() const {
  NamedParameters out;
  visit_parameters("", [&](const std::string& prefix, const std::string& name, const at::Tensor& p, const ShardSpec& shard) {
    out.push_back(NamedParameter(prefix + name, p, shard));
  });
  return out;
}

std::vector<at::Tensor> Module::parameters() const {   // the same walk, without a name per parameter
  std::vector<at::Tensor> out;
  visit_parameters("", [&](const std::string&, const std::string&, const at::Tensor& p, const ShardSpec&) { out.push_back(p); });
  return out;
}

void Module::train(bool on) {
  for (auto& [_, child] : children_) child->train(on);
  training_ = on;
}

namespace {
void check_allocated(const at::Tensor& p) {   // a deferred parameter has no values to move or convert
  if (is_unallocated(p)) throw std::logic_error("Module::to: a parameter has no storage yet (deferred)");
}
}  // namespace

void Module::to(const c10::Device& device) {
  for (auto& p : parameters()) check_allocated(p), p.set_data(p.to(device));
}

void Module::to(c10::ScalarType dtype) {
  for (auto& p : parameters())
    if (at::isFloatingType(p.scalar_type())) check_allocated(p), p.set_data(p.to(dtype));
}

}  // namespace colossal::nn
