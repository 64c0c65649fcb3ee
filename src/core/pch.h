// Precompiled header shared by every engine target: LibTorch's tensor, autograd and nn headers are
// the bulk of each translation unit's compile time. Sources still include what they use; this only
// makes those includes cheap.
#pragma once
#include <torch/torch.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <string>
#include <vector>
