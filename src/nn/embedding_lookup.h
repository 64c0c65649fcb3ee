// An embedding lookup whose backward adds straight into the table's .grad buffer when it has one
// (grad_buffer_of: the chunk store's gradient views), as the LM head's and the linear layers'
// weight gradients do. ATen's embedding backward builds a dense [V, C] gradient first (206 MB at
// GPT-2 medium's vocabulary) and autograd then adds it to .grad: a second table at the end of
// backward, where ZeRO-3's memory peaks.
#pragma once
#include <ATen/core/Tensor.h>

namespace colossal::nn {

// weight [V, C], ids int64 of any shape -> [ids..., C]; gradients flow to weight.
at::Tensor embedding_lookup(const at::Tensor& weight, const at::Tensor& ids);

}  // namespace colossal::nn
