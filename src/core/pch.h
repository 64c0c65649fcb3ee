// Precompiled header shared by every engine target. Sources still include what they use; this only
// makes those includes cheap. What goes in here is weighed, because GCC pays for a precompiled
// header in every unit that uses it, even one that includes none of it: it maps the whole file and
// instantiates every template instantiation the headers left pending (scripts/dev/build_profile.py
// shows the cost). torch/torch.h made that 5 s a unit (a 720 MB file); ATen's operators, spdlog and
// the JSON library cost about 1.4 s. Headers a few units need (autograd functions, c10d, the JIT
// pickler, torch::optim) stay out, paid only where they are included.
#pragma once
#include <ATen/ATen.h>
#include <spdlog/spdlog.h>
#include <nlohmann/json.hpp>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>
