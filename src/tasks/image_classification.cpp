// Image classification task: see image_classification.h.
#include "src/tasks/image_classification.h"

#include <ATen/ATen.h>

#include <filesystem>

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/data/image_data.h"
#include "src/nn/encoder.h"

namespace fs = std::filesystem;

namespace colossal {
namespace {

nn::ImageClassifier& classifier(nn::Model& model) { return nn::model_as<nn::ImageClassifier>(model, "the image_classification task"); }

class ImageClassificationTask final : public Task {
 public:
  explicit ImageClassificationTask(TaskData data) : data_(std::move(data)) {}

  std::string name() const override { return "image_classification"; }
  void check_data() const override {
    const Recipe& r = data_.recipe;
    const std::string& dir = r.data.dataset;
    if (dir.empty()) throw RecipeError(r.where("data.dataset"), "is required (the directory of an IDX image set, e.g. /usr/share/datasets/fashion-mnist)");
    for (const char* split : {"train", "t10k"})
      for (const char* kind : {"images-idx3-ubyte", "labels-idx1-ubyte"})
        if (idx_file(dir, split, kind).empty())
          throw RecipeError(r.where("data.dataset"), "= \"" + dir + "\" has no " + split + "-" + kind + "[.gz] (an IDX image set's files; " +
                                                         "Fashion-MNIST is Debian's dataset-fashion-mnist, which scripts/setup.sh installs " +
                                                         "in /usr/share/datasets/fashion-mnist)");
  }
  void prepare_data() override {}
  void load_data() override {
    const Recipe& r = data_.recipe;
    train_ = std::make_shared<const ImageSet>(read_idx_image_set(r.data.dataset, "train"));
    test_ = read_idx_image_set(r.data.dataset, "t10k");
    stats_ = pixel_stats(*train_);
    for (auto& [images, labels] : image_eval_batches(test_, r.train.batch_size, r.train.eval_batches, data_.dp_rank, data_.dp_size))
      eval_set_.push_back(Batch{images, labels, {}, {}});
  }
  std::string describe_data() const override {
    const auto& s = train_->images.sizes();
    return human_count(static_cast<double>(s[0])) + " train images, " + human_count(static_cast<double>(test_.images.size(0))) +
           " test images (" + std::to_string(s[2]) + "x" + std::to_string(s[3]) + ", " + std::to_string(s[1]) + " channel" +
           (s[1] > 1 ? "s" : "") + ")";
  }
  void check_model(nn::Model& model) const override {
    auto& m = classifier(model);
    const int64_t top = std::max(train_->labels.max().item<int64_t>(), test_.labels.max().item<int64_t>());
    if (top >= m.num_labels())
      throw Error("image set " + data_.recipe.data.dataset + " has labels up to " + std::to_string(top) + " but the model classifies into " +
                  std::to_string(m.num_labels()) + " (set [model] num_labels = " + std::to_string(top + 1) + ")");
    const int64_t have = train_->images.size(1);
    if (have != m.channels() && !(have == 1 && m.channels() == 3))
      throw Error("image set " + data_.recipe.data.dataset + " has " + std::to_string(have) + "-channel images but the model takes " +
                  std::to_string(m.channels()) + " (set [model] channels = " + std::to_string(have) + ")");
  }

  void start(int64_t samples_seen) override {
    const Recipe& r = data_.recipe;
    loader_ = std::make_unique<ImageLoader>(train_, r.train.batch_size, static_cast<uint64_t>(r.train.seed), data_.dp_rank,
                                            data_.dp_size, samples_seen);
  }
  Batch next() override {
    auto [images, labels] = loader_->next();
    return Batch{images, labels, {}, {}};   // uint8: normalised where the model runs
  }
  int64_t position() const override { return loader_->position(); }

  at::Tensor loss(nn::Model& model, const Batch& b) override {
    auto& m = classifier(model);
    return at::cross_entropy_loss(m.classify_images(model_input(m, b.inputs)).to(at::kFloat), b.targets);   // in fp32 whatever the model computes in
  }
  const std::vector<Batch>& eval_set() const override { return eval_set_; }
  EvalSums eval(nn::Model& model, const Batch& b) override {
    auto& m = classifier(model);
    const at::Tensor logits = m.classify_images(model_input(m, b.inputs)).to(at::kFloat);
    const double n = static_cast<double>(b.targets.size(0));
    // Weighted by images, so a short last batch counts for what it holds.
    return {at::cross_entropy_loss(logits, b.targets).item<double>() * n, n, logits.argmax(-1).eq(b.targets).sum().item<double>(), n};
  }
  bool has_accuracy() const override { return true; }

 private:
  // uint8 [B, ch, H, W] -> the float images the model was built for.
  at::Tensor model_input(nn::ImageClassifier& m, const at::Tensor& images) const {
    at::Tensor x = normalize_images(images, stats_);
    if (x.size(2) != m.image_size() || x.size(3) != m.image_size())
      x = at::upsample_bilinear2d(x, {m.image_size(), m.image_size()}, false);
    if (x.size(1) == 1 && m.channels() == 3) x = x.expand({x.size(0), 3, x.size(2), x.size(3)});
    return x;
  }

  TaskData data_;
  std::shared_ptr<const ImageSet> train_;
  ImageSet test_;
  PixelStats stats_;
  std::unique_ptr<ImageLoader> loader_;
  std::vector<Batch> eval_set_;
};

}  // namespace

std::unique_ptr<Task> make_image_classification_task(TaskData data) {
  return std::make_unique<ImageClassificationTask>(std::move(data));
}

}  // namespace colossal
