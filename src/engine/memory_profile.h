// The report of `colossal profile`: one traced training step (memory::MemoryTracer's events) turned into
// per-block figures, a table on the console, profile.json and a self-contained profile.html whose SVG
// plots show memory by kind over the step and where each chunk lived at each event.
//
// Per block: the chunk store's bytes of its tensors (parameters, gradients, optimizer states in memory,
// and their part of the offload file), each chunk's bytes shared among its tensors by their elements;
// the activations its forward kept (non-model bytes live after its forward less before it, the traced
// step's first micro-batch); and the peak of live bytes during its forward and its backward. The totals
// are the store's own accounting (ChunkStore::bytes()) at the end of the step.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "src/memory/chunk_store.h"
#include "src/memory/memory_tracer.h"

namespace colossal {

// `title` names the run (recipe, model) in the outputs.
nlohmann::json memory_profile_json(const memory::ChunkStore& store, const memory::MemoryTracer& tracer, const std::string& title);
std::string memory_profile_table(const nlohmann::json& profile);
std::string memory_profile_html(const nlohmann::json& profile);

}  // namespace colossal
