// The masked language-modelling task (BERT pretraining): windows of the token dataset wrapped as
// [CLS] ... [SEP] and masked 15% (80/10/10, src/data/mlm_masking), cross entropy on the masked
// positions through the model's MLM head, eval loss and masked-token accuracy on the held-out split.
#pragma once
#include <memory>

#include "src/tasks/task.h"

namespace colossal {

std::unique_ptr<Task> make_masked_lm_task(TaskData data);

}  // namespace colossal
