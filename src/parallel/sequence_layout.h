// SequenceLayout: which tokens of each sequence a sequence-parallel rank holds. The sequence of T
// tokens is cut into equal chunks; rank r holds chunk r of S (contiguous: split_gather and
// all_to_all, whose gathered chunks then line up in order), or chunks r and 2S-1-r of 2S (zigzag:
// ring attention, where under a causal mask the early chunks see little and the late ones much, and
// pairing one of each gives every rank the same work).
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <vector>

namespace colossal::parallel {

class SequenceLayout {
 public:
  SequenceLayout(int64_t ranks, int64_t rank, bool zigzag) : ranks_(ranks), rank_(rank), zigzag_(zigzag) {}

  int64_t ranks() const { return ranks_; }
  int64_t rank() const { return rank_; }
  bool zigzag() const { return zigzag_; }
  int64_t chunks() const { return zigzag_ ? 2 * ranks_ : ranks_; }   // the sequence is cut into this many
  // The chunk indices rank `r` holds, in its order.
  std::vector<int64_t> chunks_of(int64_t r) const;
  // This rank's tokens of x along `dim` (of length T, a multiple of chunks()), in its order.
  at::Tensor local(const at::Tensor& x, int64_t dim) const;
  // The positions of this rank's tokens in a sequence of T [T / ranks] (int64).
  at::Tensor positions(int64_t t) const;

 private:
  int64_t ranks_, rank_;
  bool zigzag_;
};

}  // namespace colossal::parallel
