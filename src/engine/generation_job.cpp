// Joining or launching a tensor-parallel generation job: see generation_job.h.
#include "src/engine/generation_job.h"

#include <filesystem>
#include <unistd.h>

#include "src/core/error.h"
#include "src/core/log.h"
#include "src/dist/launch_env.h"
#include "src/dist/launcher.h"

namespace fs = std::filesystem;

namespace colossal {

GenerationJob GenerationJob::start(int64_t tensor, const std::function<std::vector<std::string>()>& worker_args,
                                   const std::string& flag) {
  GenerationJob job;
  const dist::WorkerEnv env = dist::worker_env(dist::process_env());
  if (tensor == 1) {
    if (env.world > 1)
      throw Error("this process is rank " + std::to_string(env.rank) + " of a job of " + std::to_string(env.world) + " (" + env.source +
                  "), but " + flag + " is 1: give " + flag + " " + std::to_string(env.world) + " to split the model across them");
    return job;
  }
  if (env.world == 1) {   // the user's process: start the workers and wait for them
    dist::LaunchOptions lo;
    lo.nproc_per_node = tensor;
    lo.state_dir = (fs::temp_directory_path() / ("colossal-job-" + std::to_string(getpid()))).string();
    lo.worker_args = [worker_args](int64_t) { return worker_args(); };
    job.launched_ = true;
    job.exit_code_ = dist::run_launcher(lo);
    std::error_code ignored;
    fs::remove_all(lo.state_dir, ignored);
    return job;
  }
  if (env.world != tensor)
    throw Error(flag + " " + std::to_string(tensor) + " in a job of " + std::to_string(env.world) + " ranks (" + env.source +
                "): the model is split across every rank, so give " + flag + " " + std::to_string(env.world));
  dist::MeshShape shape;
  shape.size[static_cast<int>(dist::Dim::tp)] = tensor;
  dist::use_worker_threads(env);   // each its share of the node's cores, as training's workers
  set_log_rank(env.rank, env.world);
  job.runtime_ = dist::Runtime::join(env, shape, dist::JoinOptions{});
  return job;
}

}  // namespace colossal
