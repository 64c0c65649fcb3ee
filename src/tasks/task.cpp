// The task table and what every task shares: see task.h.
#include "src/tasks/task.h"

#include "src/core/error.h"
#include "src/core/text.h"
#include "src/tasks/causal_lm.h"
#include "src/tasks/image_classification.h"
#include "src/tasks/masked_lm.h"

namespace colossal {
namespace {

struct TaskEntry {
  const char* name;
  std::unique_ptr<Task> (*make)(TaskData);
};

const std::vector<TaskEntry>& tasks() {
  static const std::vector<TaskEntry> table = {
      {"causal_lm", make_causal_lm_task},
      {"masked_lm", make_masked_lm_task},
      {"image_classification", make_image_classification_task},
  };
  return table;
}

}  // namespace

Batch Batch::to(const c10::Device& device) const {
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  return Batch{move(inputs), move(targets), move(attention_mask), move(token_types), move(positions)};
}

std::vector<std::string> task_names() {
  std::vector<std::string> names;
  for (const auto& t : tasks()) names.emplace_back(t.name);
  return names;
}

std::unique_ptr<Task> make_task(const std::string& name, TaskData data) {
  for (const auto& t : tasks())
    if (name == t.name) return t.make(std::move(data));
  throw Error("this model trains for the task \"" + name + "\", which the trainer does not run yet (valid: " + join(task_names(), ", ") + ")");
}

}  // namespace colossal
