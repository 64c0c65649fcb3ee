// The conjugate pairs of Megatron-style sequence parallelism (tensor_sequence.h), over the token
// dimension (dim 1 of [B, T, ...]) of a tensor-parallel group, where each rank holds T / P tokens of
// every sequence, contiguous and in rank order:
//
//   split_tokens    this rank's tokens forward          all-gather of the gradient backward
//   join_tokens     all-gather forward                  this rank's tokens of the gradient backward
//   gather_tokens   all-gather forward                  reduce-scatter of the gradient backward
//                   (a column-split layer's input: each rank then computes different features)
//   scatter_tokens  reduce-scatter of partial sums      all-gather of the gradient backward
//                   forward (a row-split layer's output)
//
// gather_tokens and scatter_tokens replace a 1D block's enter and leave (one all-reduce each way
// becomes an all-gather and a reduce-scatter: the same bytes), so everything between them holds 1/P
// of the tokens. A group of one makes every one of them the identity.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

at::Tensor split_tokens(const at::Tensor& x, dist::Group& group);
at::Tensor join_tokens(const at::Tensor& x, dist::Group& group);
at::Tensor gather_tokens(const at::Tensor& x, dist::Group& group);
at::Tensor scatter_tokens(const at::Tensor& x, dist::Group& group);

// The collectives alone, without autograd: [B, T/P, ...] -> [B, T, ...] in rank order, and partial
// sums [B, T, ...] -> this rank's tokens of their sum [B, T/P, ...].
at::Tensor all_gather_tokens(const at::Tensor& x, dist::Group& group, const char* what);
at::Tensor reduce_scatter_tokens(const at::Tensor& x, dist::Group& group, const char* what);

}  // namespace colossal::parallel
