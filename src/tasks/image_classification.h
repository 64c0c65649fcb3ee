// The image-classification task: an IDX image set ([data] dataset names its directory; Fashion-MNIST
// from Debian's dataset-fashion-mnist by default), shuffled and sharded by data-parallel rank, images
// normalised by the training set's pixel statistics (and resized, or grey repeated to three channels,
// when the model was built for other images, as when fine-tuning an ImageNet ViT), cross entropy on
// the labels; eval is the loss and accuracy on the test split.
#pragma once
#include <memory>

#include "src/tasks/task.h"

namespace colossal {

std::unique_ptr<Task> make_image_classification_task(TaskData data);

}  // namespace colossal
