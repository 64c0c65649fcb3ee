// The causal language-modelling task: windows of the token dataset, next-token cross entropy through
// the fused head + loss, eval loss on the held-out split (GPT-2, OPT, BLOOM).
#pragma once
#include <memory>

#include "src/tasks/task.h"

namespace colossal {

std::unique_ptr<Task> make_causal_lm_task(TaskData data);

}  // namespace colossal
