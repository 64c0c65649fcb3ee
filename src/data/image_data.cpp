// Image-classification data: see image_data.h.
#include "src/data/image_data.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <filesystem>

#include "src/core/error.h"
#include "src/data/idx.h"
#include "src/data/mlm_masking.h"

namespace fs = std::filesystem;

namespace colossal {

std::string idx_file(const std::string& dir, const std::string& split, const std::string& kind) {
  const std::string base = (fs::path(dir) / (split + "-" + kind)).string();
  if (fs::is_regular_file(base)) return base;
  if (fs::is_regular_file(base + ".gz")) return base + ".gz";
  return "";
}

ImageSet read_idx_image_set(const std::string& dir, const std::string& split) {
  const std::string images_path = idx_file(dir, split, "images-idx3-ubyte"), labels_path = idx_file(dir, split, "labels-idx1-ubyte");
  for (const auto& [path, kind] : {std::pair{images_path, "images-idx3-ubyte"}, {labels_path, "labels-idx1-ubyte"}})
    if (path.empty()) throw Error("image set " + dir + ": " + split + "-" + kind + "[.gz] is missing");
  IdxArray images = read_idx(images_path), labels = read_idx(labels_path);
  if (images.dims.size() != 3 && images.dims.size() != 4)
    throw Error("IDX file " + images_path + ": has " + std::to_string(images.dims.size()) + " dimensions (images are [N, H, W] or [N, C, H, W])");
  if (labels.dims.size() != 1 || labels.dims[0] != images.dims[0])
    throw Error("IDX file " + labels_path + ": holds " + (labels.dims.size() == 1 ? std::to_string(labels.dims[0]) + " labels" : "no label list") +
                " for the " + std::to_string(images.dims[0]) + " images of " + images_path);
  std::vector<int64_t> shape = images.dims;
  if (shape.size() == 3) shape.insert(shape.begin() + 1, 1);   // one channel
  ImageSet set;
  set.images = at::from_blob(images.values.data(), shape, at::kByte).clone();
  set.labels = at::from_blob(labels.values.data(), {labels.dims[0]}, at::kByte).to(at::kLong);
  return set;
}

PixelStats pixel_stats(const ImageSet& set) {
  // In chunks, so the statistics of 60,000 images do not hold a double copy of all of them.
  const at::Tensor flat = set.images.reshape({-1});
  const int64_t n = flat.numel(), chunk = int64_t{1} << 22;
  double sum = 0, squares = 0;
  for (int64_t start = 0; start < n; start += chunk) {
    const at::Tensor x = flat.narrow(0, start, std::min(chunk, n - start)).to(at::kDouble);
    sum += x.sum().item<double>();
    squares += x.square().sum().item<double>();
  }
  const double mean = sum / static_cast<double>(n);
  const double var = (squares - sum * mean) / static_cast<double>(std::max<int64_t>(n - 1, 1));   // unbiased, as torch's std
  return {mean / 255.0, std::max(std::sqrt(std::max(var, 0.0)) / 255.0, 1e-6)};
}

at::Tensor normalize_images(const at::Tensor& images, const PixelStats& s) {
  return images.to(at::kFloat).div_(255.0).sub_(s.mean).div_(s.std);
}

ImageLoader::ImageLoader(std::shared_ptr<const ImageSet> set, int64_t batch_size, uint64_t seed, int64_t rank, int64_t world,
                         int64_t start_sample)
    : set_(std::move(set)), batch_(batch_size), rank_(rank), world_(world), position_(start_sample), seed_(seed) {
  const int64_t n = set_->images.size(0);
  if (n < batch_ * world_)
    throw Error("the image set holds " + std::to_string(n) + " images, fewer than one global batch of " + std::to_string(batch_ * world_));
}

const at::Tensor& ImageLoader::order_of(int64_t epoch) {
  if (epoch != order_epoch_) {
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(batch_seed(seed_, static_cast<uint64_t>(epoch), 0x696d67ULL));
    order_ = at::randperm(set_->images.size(0), gen, at::kLong);
    order_epoch_ = epoch;
  }
  return order_;
}

std::pair<at::Tensor, at::Tensor> ImageLoader::next() {
  const int64_t n = set_->images.size(0);
  std::vector<int64_t> picks(static_cast<size_t>(batch_));
  for (int64_t i = 0; i < batch_; ++i) {
    const int64_t sample = position_ + rank_ * batch_ + i;   // this rank's share of the global batch
    picks[static_cast<size_t>(i)] = order_of(sample / n)[sample % n].item<int64_t>();
  }
  position_ += batch_ * world_;
  const at::Tensor index = at::tensor(picks, at::kLong);
  return {set_->images.index_select(0, index), set_->labels.index_select(0, index)};
}

std::vector<std::pair<at::Tensor, at::Tensor>> image_eval_batches(const ImageSet& set, int64_t batch_size, int64_t max_batches,
                                                                  int64_t rank, int64_t world) {
  std::vector<std::pair<at::Tensor, at::Tensor>> out;
  const int64_t n = set.images.size(0);
  const int64_t batches = (n + batch_size - 1) / batch_size, take = max_batches > 0 ? std::min(max_batches, batches) : batches;
  for (int64_t k = rank; k < take; k += world) {
    const int64_t start = k * batch_size, len = std::min(batch_size, n - start);
    out.push_back({set.images.narrow(0, start, len), set.labels.narrow(0, start, len)});
  }
  return out;
}

}  // namespace colossal
