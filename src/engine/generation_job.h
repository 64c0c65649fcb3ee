// How a process takes part in a generation job split across --tensor-parallel N ranks (infer):
//  - N = 1: alone, nothing to join;
//  - N > 1, started by the user: it starts N workers of the same command on this node and supervises
//    them (dist::run_launcher: one failing ends all, named); launched() is then true and the caller
//    only passes on exit_code();
//  - N > 1 inside a job of N ranks (that launcher's workers, or torchrun's, or srun's): it joins the
//    rendezvous with a mesh of N tensor-parallel ranks. Every rank computes the same tokens (the logits
//    are gathered whole on each); rank 0 speaks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/dist/runtime.h"

namespace colossal {

class GenerationJob {
 public:
  // `worker_args`: the command a worker runs (argv without the program). `flag` names the option in errors.
  static GenerationJob start(int64_t tensor, const std::function<std::vector<std::string>()>& worker_args, const std::string& flag);

  bool launched() const { return launched_; }
  int exit_code() const { return exit_code_; }
  // The tensor-parallel group (null when alone).
  dist::Group* tensor_group() const { return runtime_ ? &runtime_->group(dist::Dim::tp) : nullptr; }
  bool is_root() const { return !runtime_ || runtime_->is_root(); }

 private:
  bool launched_ = false;
  int exit_code_ = 0;
  std::shared_ptr<dist::Runtime> runtime_;
};

}  // namespace colossal
