// Launch environment: SLURM host lists and task counts, torchrun's and SLURM's variables, launcher-free
// worker discovery, the threads a worker takes, and the device each local rank gets.
#include <gtest/gtest.h>

#include "src/core/device.h"
#include "src/core/error.h"
#include "src/dist/launch_env.h"
#include "tests/support/test_support.h"

using namespace colossal;
using namespace colossal::dist;
using colossal::test::error_of;

namespace {

using Hosts = std::vector<std::string>;

}  // namespace

TEST(SlurmNodelist, ExpandsRangesListsAndPaddingAcrossGroups) {
  const std::vector<std::pair<std::string, Hosts>> table = {
      {"node1", {"node1"}},
      {"a,b,c", {"a", "b", "c"}},
      {"gpu[01-04,07],cpu-a[1-2]", {"gpu01", "gpu02", "gpu03", "gpu04", "gpu07", "cpu-a1", "cpu-a2"}},
      {"n[008-010]", {"n008", "n009", "n010"}},
      {"n[8-10]", {"n8", "n9", "n10"}},
      {"r[1-2]n[3-4]", {"r1n3", "r1n4", "r2n3", "r2n4"}},
      {"x[5]", {"x5"}},
      {"node1.cluster,node2.cluster", {"node1.cluster", "node2.cluster"}},
      {"a[1-2]-ib", {"a1-ib", "a2-ib"}},
      {"c[0-1],d", {"c0", "c1", "d"}},
  };
  for (const auto& [list, hosts] : table) {
    EXPECT_EQ(expand_nodelist(list), hosts) << list;
    EXPECT_EQ(first_host(list), hosts.front()) << list;
  }
}

TEST(SlurmNodelist, MalformedListsSayWhatAndWhere) {
  const std::vector<std::pair<std::string, std::string>> table = {
      {"gpu[03-01]", "range 03-01 runs backwards (write low-high) at character 5"},
      {"gpu[]", "empty brackets"},
      {"gpu[1-2", "'[' without ']'"},
      {"gpu1-2]", "']' without '['"},
      {"gpu[1-[2]]", "nested '['"},
      {"a,,b", "empty host name"},
      {"a,", "empty host name"},
      {"gpu[1,,2]", "empty item in brackets"},
      {"gpu[a-b]", "\"a-b\" is not a number or low-high range"},
      {"gpu[1-99999999999999999999]", "is not a number"},
      {"gpu 1", "whitespace"},
      {"[1-2]", "cannot start with '['"},
      {"", "is empty"},
  };
  for (const auto& [list, message] : table) {
    const std::string e = error_of([&] { expand_nodelist(list); });
    EXPECT_NE(e.find(message), std::string::npos) << list << ": " << e;
    EXPECT_NE(e.find("SLURM_JOB_NODELIST"), std::string::npos) << e;
  }
}

TEST(SlurmNodelist, ExpansionIsCappedButTheFirstHostOfAHugeListIsCheap) {
  EXPECT_NE(error_of([] { expand_nodelist("n[0-99999999]", 1000); }).find("more than 1000 hosts"), std::string::npos);
  EXPECT_NE(error_of([] { expand_nodelist("a[0-99]b[0-99]", 1000); }).find("more than 1000 hosts"), std::string::npos);
  EXPECT_EQ(first_host("n[0000-99999999],m[1-2]"), "n0000");
  EXPECT_EQ(expand_nodelist("a[0-9]b[0-9]", 100).size(), 100u);
}

TEST(SlurmTasksPerNode, ReadsCompressedCounts) {
  EXPECT_EQ(tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(tasks_on_node("4", 0), 4);
  EXPECT_EQ(tasks_on_node("1,2,3", 1), 2);
  EXPECT_NE(error_of([] { tasks_on_node("2(x3),1", 4); }).find("has 4 node(s), no node 4"), std::string::npos);
  for (const char* bad : {"", "x", "2(x)", "2(y3)", "2(x3", "0", "2(x0)", ",", "1,"})
    EXPECT_NE(error_of([&] { tasks_on_node(bad, 0); }).find("SLURM_STEP_TASKS_PER_NODE"), std::string::npos) << bad;
}

TEST(WorkerEnv, TorchrunVariablesPlaceTheWorker) {
  auto w = worker_env(map_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                               {"GROUP_RANK", "1"}, {"MASTER_ADDR", "10.1.2.3"}, {"MASTER_PORT", "29600"}}));
  EXPECT_EQ(w.source, "torchrun");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world, 4);
  EXPECT_EQ(w.node_rank, 1);
  EXPECT_EQ(w.nnodes, 2);
  EXPECT_EQ(w.master_addr, "10.1.2.3");
  EXPECT_EQ(w.master_port, 29600);
  EXPECT_FALSE(w.agent_store);
  auto agent = worker_env(map_env({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"},
                                   {"TORCHELASTIC_USE_AGENT_STORE", "True"}, {"TORCHELASTIC_RESTART_COUNT", "2"}}));
  EXPECT_TRUE(agent.agent_store);   // torchrun's agent hosts the store: rank 0 joins it as a client
  EXPECT_EQ(agent.restart_count, 2);
  // Without the LOCAL_* variables: one worker per node is assumed.
  auto bare = worker_env(map_env({{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}));
  EXPECT_EQ(bare.local_world, 1);
  EXPECT_EQ(bare.nnodes, 2);
  EXPECT_EQ(bare.master_port, 29500);
}

TEST(WorkerEnv, BadTorchrunValuesNameTheVariable) {
  auto err = [](std::map<std::string, std::string> v) { return error_of([&] { worker_env(map_env(v)); }); };
  EXPECT_NE(err({{"RANK", "x"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("RANK=\"x\" is not a whole number"), std::string::npos);
  EXPECT_NE(err({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("RANK=4 but WORLD_SIZE=4"), std::string::npos);
  EXPECT_NE(err({{"RANK", "-1"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("RANK=\"-1\""), std::string::npos);
  EXPECT_NE(err({{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("WORLD_SIZE=0 is out of range"), std::string::npos);
  EXPECT_NE(err({{"RANK", "0"}, {"WORLD_SIZE", "2"}}).find("MASTER_ADDR is not"), std::string::npos);
  EXPECT_NE(err({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "70000"}}).find("MASTER_PORT=70000"),
            std::string::npos);
  EXPECT_NE(err({{"RANK", "0"}, {"WORLD_SIZE", "6"}, {"LOCAL_WORLD_SIZE", "4"}, {"MASTER_ADDR", "h"}}).find("not a multiple"),
            std::string::npos);
  EXPECT_NE(err({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "a b"}}).find("whitespace"), std::string::npos);
  EXPECT_NE(err({{"RANK", "1 "}, {"WORLD_SIZE", "2"}, {"MASTER_ADDR", "h"}}).find("RANK=\"1 \""), std::string::npos);
}

TEST(WorkerEnv, SlurmStepVariablesPlaceTheWorkerWithTheFirstHostAsMaster) {
  std::map<std::string, std::string> v = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "7"}, {"SLURM_STEP_ID", "0"},
                                          {"SLURM_NODEID", "2"}, {"SLURM_NNODES", "4"}, {"SLURM_LOCALID", "1"},
                                          {"SLURM_STEP_TASKS_PER_NODE", "2(x3),1"}, {"SLURM_JOB_ID", "123456"},
                                          {"SLURM_JOB_NODELIST", "gpu[01-04,07],cpu-a[1-2]"}};
  auto w = worker_env(map_env(v));
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world, 7);
  EXPECT_EQ(w.node_rank, 2);
  EXPECT_EQ(w.nnodes, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world, 2);
  EXPECT_EQ(w.master_addr, "gpu01");
  EXPECT_EQ(w.master_port, 20000 + 123456 % 10000);
  v["MASTER_ADDR"] = "10.0.0.9";
  v["MASTER_PORT"] = "31000";
  w = worker_env(map_env(v));
  EXPECT_EQ(w.master_addr, "10.0.0.9");
  EXPECT_EQ(w.master_port, 31000);
  // The step's own node list wins over the job's (a step may run on a subset).
  v.erase("MASTER_ADDR");
  v["SLURM_STEP_NODELIST"] = "cpu-a[1-2]";
  EXPECT_EQ(worker_env(map_env(v)).master_addr, "cpu-a1");
  v["SLURM_LOCALID"] = "2";
  EXPECT_NE(error_of([&] { worker_env(map_env(v)); }).find("SLURM_LOCALID=2 but tasks on this node=2"), std::string::npos);
}

TEST(WorkerEnv, TorchrunWinsOverSlurmAndABatchScriptIsOneProcess) {
  auto w = worker_env(map_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_STEP_ID", "0"},
                               {"SLURM_JOB_NODELIST", "a[1-2]"}, {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"MASTER_ADDR", "m"}}));
  EXPECT_EQ(w.source, "torchrun");
  EXPECT_EQ(w.rank, 3);
  // The batch script has SLURM_PROCID and SLURM_NTASKS but is not an srun step.
  auto batch = worker_env(map_env({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "2"}, {"SLURM_JOB_NODELIST", "a[1-2]"}}));
  EXPECT_EQ(batch.source, "single");
  EXPECT_EQ(batch.world, 1);
  EXPECT_EQ(worker_env(map_env({})).source, "single");
}

TEST(WorkerThreads, ComeFromSlurmTheAffinityMaskOrTheNodeSharedByLocalRanks) {
  EXPECT_EQ(worker_threads(map_env({{"SLURM_CPUS_PER_TASK", "3"}}), 16, 16, 4), 3);
  EXPECT_EQ(worker_threads(map_env({}), 2, 16, 4), 2);     // pinned to 2 CPUs
  EXPECT_EQ(worker_threads(map_env({}), 16, 16, 4), 4);    // the node over its 4 local ranks
  EXPECT_EQ(worker_threads(map_env({}), 2, 2, 4), 1);      // never below 1
  EXPECT_EQ(worker_threads(map_env({}), 16, 16, 1), 16);
  EXPECT_NE(error_of([] { worker_threads(map_env({{"SLURM_CPUS_PER_TASK", "0"}}), 2, 2, 1); }).find("SLURM_CPUS_PER_TASK=0"),
            std::string::npos);
}

TEST(RankDevice, EachLocalRankGetsItsOwnGpuAndRanksThatWouldShareOneFallBackUnderAutoOrAreRefused) {
  const c10::Device gpu(c10::kCUDA, 0), cpu(c10::kCPU);
  // The CPU, or one rank: as resolved.
  EXPECT_EQ(device_for_rank(cpu, "auto", 1, 4, 0, false, "train.device"), cpu);
  EXPECT_EQ(device_for_rank(gpu, "cuda", 0, 1, 1, false, "train.device"), gpu);
  // Enough GPUs: rank r takes GPU r.
  EXPECT_EQ(device_for_rank(gpu, "auto", 3, 4, 8, false, "train.device"), c10::Device(c10::kCUDA, 3));
  // A launcher's binding (CUDA_VISIBLE_DEVICES set): a process that sees 1 of the node's GPUs uses it.
  EXPECT_EQ(device_for_rank(gpu, "cuda", 3, 4, 1, true, "train.device"), gpu);
  EXPECT_EQ(device_for_rank(gpu, "auto", 3, 4, 2, true, "train.device"), c10::Device(c10::kCUDA, 1));
  // Four ranks sharing one GPU: "auto" trains on the CPU, "cuda" is refused at its key.
  EXPECT_EQ(device_for_rank(gpu, "auto", 2, 4, 1, false, "train.device"), cpu);
  const std::string e = error_of([&] { device_for_rank(gpu, "cuda", 2, 4, 1, false, "r.toml:3: [train] device"); });
  EXPECT_NE(e.find("r.toml:3: [train] device"), std::string::npos) << e;
  EXPECT_NE(e.find("4 ranks on this node but 1 GPU(s) visible: each rank needs a GPU of its own"), std::string::npos) << e;
}
