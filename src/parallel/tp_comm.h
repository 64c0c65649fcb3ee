// The conjugate communication pairs every tensor-parallel layer is made of (Megatron's mappings), as
// small autograd functions over a dist::Group, so each layer states only where its region starts and
// ends and backward communicates exactly where forward did not:
//
//   enter_region    identity forward      all-reduce of the gradient backward   (the input of a column split)
//   leave_region    all-reduce forward    identity backward                     (the output of a row split)
//   gather_last     all-gather along the last dimension forward, this rank's slice of the gradient backward
//   take_slice      this rank's slice of the last dimension forward, all-gather of the gradient backward
//
// A group of one (or without a backend) makes every one of them the identity.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

at::Tensor enter_region(const at::Tensor& x, dist::Group& group);
at::Tensor leave_region(const at::Tensor& x, dist::Group& group);
// The sum over the group both ways: forward all-reduces x, backward all-reduces its gradient (a sum
// whose result every rank then uses differently, as 2D LayerNorm's statistics over a row's features).
at::Tensor sum_over(const at::Tensor& x, dist::Group& group);
// x [..., n] on every rank -> [..., n * size] in rank order.
at::Tensor gather_last(const at::Tensor& x, dist::Group& group);
// x [..., n * size] -> this rank's [..., n].
at::Tensor take_slice(const at::Tensor& x, dist::Group& group);

// The pair for features spread along a group and partial sums of them: gather_partial all-gathers x's
// last dimension forward and reduce-scatters its gradient backward (the whole is then used differently
// on each rank, as the head of a vocabulary range); scatter_sum reduce-scatters a partial sum by its
// last dimension forward and all-gathers the gradient backward (a lookup of a vocabulary range).
at::Tensor gather_partial(const at::Tensor& x, dist::Group& group);
at::Tensor scatter_sum(const at::Tensor& x, dist::Group& group);

// All-gather of x along the last dimension without autograd (also used by the two above).
at::Tensor all_gather_last(const at::Tensor& x, dist::Group& group, const char* what);

}  // namespace colossal::parallel
