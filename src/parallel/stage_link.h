// StageLink: the activations and gradients a pipeline rank exchanges with its neighbours, over the
// pipeline group's point-to-point transfers. Virtual stage s lives on pipeline rank s % P (P ranks,
// pipeline_schedule.h), so stage s's neighbours are the ranks before and after this one, round the ring
// when the model is interleaved.
//  - Shapes are agreed once: the first activation a stage sends under a key (the batch's shape: eval
//    batches may differ from training ones) carries its shape and dtype, later ones only their data.
//    A gradient has the shape of the activation it belongs to, which the receiver holds.
//  - Sends are asynchronous (the tensor is kept until the transfer completes); receives block, and the
//    time they block is counted (the wall-clock bubble).
//  - Receive buffers are reused from step to step: each is lent out, and taken back at the step's end
//    once nothing else refers to its memory (a received activation lives until its backward, and a
//    gradient passed through a residual sum may be the very tensor sent on as the input's gradient).
//  - Every transfer carries the sender's logical clock: passes cost fixed units (pass_cost: a forward 1,
//    a backward 2, or 1 and 1 split in zero-bubble's B and W) and a pass starts at the later of the rank's clock and its input's, so a step's idle fraction in
//    those units measures the order the ranks really ran, independent of the machine's noise.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "src/core/spare_buffers.h"
#include "src/dist/group.h"

namespace colossal::parallel {

class StageLink {
 public:
  StageLink(dist::Group& pipeline, int64_t chunks);
  int64_t ranks() const { return group_.size(); }
  int64_t rank() const { return group_.rank(); }
  int64_t stages() const { return ranks() * chunks_; }
  int64_t stage_of(int64_t chunk) const { return chunk * ranks() + rank(); }

  // Activation out of stage `stage` (to stage + 1), gradient into it from stage + 1 (and the reverse).
  void send_activation(const at::Tensor& x, int64_t stage, const std::string& key, double clock, const std::string& what);
  at::Tensor recv_activation(int64_t stage, const std::string& key, const at::TensorOptions& device, double* clock, const std::string& what);
  void send_grad(const at::Tensor& g, int64_t stage, double clock, const std::string& what);
  // Into a buffer shaped and typed like `like` (the activation this stage sent).
  at::Tensor recv_grad(const at::Tensor& like, int64_t stage, double* clock, const std::string& what);
  void finish_sends();   // waits for every send in flight (the step's end) and takes back the free receive buffers
  double take_wait_s();  // seconds receives blocked since the last take

 private:
  int64_t rank_of(int64_t stage) const { return stage % ranks(); }
  void send(const at::Tensor& t, int64_t peer, const std::string& what);
  void recv(const at::Tensor& t, int64_t peer, const std::string& what);
  at::Tensor lend(const std::vector<int64_t>& shape, const at::TensorOptions& options);   // a receive buffer
  dist::Group& group_;
  int64_t chunks_;
  std::map<std::pair<int64_t, std::string>, std::pair<std::vector<int64_t>, at::ScalarType>> agreed_;   // (stage, key) -> shape, dtype
  std::vector<std::pair<dist::Pending, at::Tensor>> sending_;
  SpareBuffers spares_{64};
  std::vector<at::Tensor> lent_;   // receive buffers out this step (flat)
  double wait_s_ = 0;
};

}  // namespace colossal::parallel
