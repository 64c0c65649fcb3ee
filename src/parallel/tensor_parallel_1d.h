// 1D tensor parallelism (Megatron-LM's): the layer factory whose column-split linears keep a slice of
// the output features, row-split linears a slice of the input features, and vocabulary-split
// embeddings a range of the vocabulary, on every rank of the tensor-parallel group. Models ask for
// splits by name (nn::Split); this factory makes them real, so one block runs
//
//   x ─ enter ─ qkv (column, heads whole) ─ attention of the local heads ─ proj (row) ─ leave ─┐
//   ─ enter ─ fc (column) ─ activation ─ proj (row) ─ leave ─ ...
//
// with one all-reduce per sublayer in forward and one in backward (tp_comm.h). Each layer allocates
// only its partition, and registers how it is a piece of the whole tensor (nn::ShardSpec), so
// initialisation, loading and checkpoints see whole Hugging Face tensors.
#pragma once
#include <memory>

#include "src/nn/factory.h"
#include "src/nn/random_stream.h"

namespace colossal::dist {
class Group;
}

namespace colossal::parallel {

class TensorParallel1d : public nn::LayerFactory {
 public:
  // `group`: the tensor-parallel ranks (the mesh's tp dimension); it must outlive the model. `seed`: the run's; each rank's dropout stream inside the split regions
  // starts from seed + 2718 + its rank (Megatron's offset), the same on every data-parallel replica.
  // `local`: the factory of each rank's piece of a split layer when it is not a dense fp32 one (a
  // quantized model's: quant::QuantizedLayerFactory, weight-only schemes), for inference.
  TensorParallel1d(dist::Group& group, nn::ParamStorage storage = nn::ParamStorage::allocated, uint64_t seed = 0,
                   std::shared_ptr<nn::LayerFactory> local = nullptr);

  std::shared_ptr<nn::Linear> linear(const nn::LinearSpec& spec) override;
  std::shared_ptr<nn::Embedding> embedding(int64_t num, int64_t dim, nn::Split split = nn::Split::Replicated) override;
  nn::HeadRange local_heads(int64_t heads) const override;
  std::shared_ptr<nn::RandomStream> region_random() override { return region_random_; }
  std::shared_ptr<nn::LayerNorm> layer_norm(int64_t dim, double eps) override;
  std::shared_ptr<const nn::StreamCut> stream_cut() const override;

  dist::Group& group() const { return group_; }
  // Megatron-style sequence parallelism (tensor_sequence.h): blocks built from now on hold each rank's
  // tokens between their row- and column-split layers. Training only.
  void split_block_tokens(bool on) { tokens_ = on; }

 private:
  dist::Group& group_;
  bool tokens_ = false;
  std::shared_ptr<nn::RandomStream> region_random_;
  std::shared_ptr<nn::LayerFactory> local_;   // shared with the attention layers, which outlive the factory
};

}  // namespace colossal::parallel
