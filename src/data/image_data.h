// Image-classification data: an IDX image set (MNIST's layout: <split>-images-idx3-ubyte and
// <split>-labels-idx1-ubyte, optionally .gz) and a loader of shuffled, rank-sharded batches.
// The loader follows WindowLoader's contract: each epoch visits the images in a seed-dependent
// permutation; the epochs form one global stream of samples, rank r of W takes samples
// [r*B, (r+1)*B) of each global batch of B x W, and the position is counted in global samples, so a
// run restarted there (with any number of ranks) continues exactly where an uninterrupted one is.
#pragma once
#include <ATen/core/Tensor.h>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace colossal {

struct ImageSet {
  at::Tensor images;   // [N, C, H, W] uint8
  at::Tensor labels;   // [N] int64
};

// The split ("train", "t10k") of the IDX set in `dir`; Error naming the file otherwise.
ImageSet read_idx_image_set(const std::string& dir, const std::string& split);
// The files a split is read from, the .gz form when the plain one is absent ("" when neither is).
std::string idx_file(const std::string& dir, const std::string& split, const std::string& kind);

struct PixelStats {
  double mean = 0, std = 1;   // over every pixel of a set, in [0, 1] units
};
PixelStats pixel_stats(const ImageSet& set);
// uint8 images -> float (x / 255 - mean) / std.
at::Tensor normalize_images(const at::Tensor& images, const PixelStats& stats);

class ImageLoader {
 public:
  // Error if the set cannot fill one global batch.
  ImageLoader(std::shared_ptr<const ImageSet> set, int64_t batch_size, uint64_t seed, int64_t rank, int64_t world,
              int64_t start_sample = 0);
  // This rank's next batch: images [B, C, H, W] uint8 and labels [B].
  std::pair<at::Tensor, at::Tensor> next();
  int64_t position() const { return position_; }

 private:
  const at::Tensor& order_of(int64_t epoch);

  std::shared_ptr<const ImageSet> set_;
  int64_t batch_, rank_, world_, position_;
  uint64_t seed_;
  int64_t order_epoch_ = -1;
  at::Tensor order_;   // the permutation of order_epoch_
};

// Held-out batches: consecutive images of `set`, batch k to rank k % world (the last may be short),
// up to `max_batches` in all (0: the whole set).
std::vector<std::pair<at::Tensor, at::Tensor>> image_eval_batches(const ImageSet& set, int64_t batch_size, int64_t max_batches,
                                                                  int64_t rank, int64_t world);

}  // namespace colossal
