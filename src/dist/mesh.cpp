// Device mesh arithmetic: see mesh.h.
#include "src/dist/mesh.h"

#include "src/core/error.h"

namespace colossal::dist {

const char* dim_name(Dim d) {
  switch (d) {
    case Dim::pp: return "pp";
    case Dim::dp: return "dp";
    case Dim::sp: return "sp";
    case Dim::tp: return "tp";
  }
  return "?";
}

std::string MeshShape::describe() const {
  return "dp=" + std::to_string(of(Dim::dp)) + " pp=" + std::to_string(of(Dim::pp)) + " tp=" + std::to_string(of(Dim::tp)) +
         " sp=" + std::to_string(of(Dim::sp));
}

MeshShape resolve_mesh(const Recipe& r, int64_t world) {
  const ParallelConfig& p = r.parallel;
  const int64_t others = p.tensor * p.pipeline * p.sequence;
  const std::string sizes = "tensor " + std::to_string(p.tensor) + " x pipeline " + std::to_string(p.pipeline) +
                            " x sequence " + std::to_string(p.sequence);
  MeshShape m;
  m.size[static_cast<int>(Dim::pp)] = p.pipeline;
  m.size[static_cast<int>(Dim::sp)] = p.sequence;
  m.size[static_cast<int>(Dim::tp)] = p.tensor;
  if (p.tensor_mode == "2d") {
    int64_t q = 1;
    while ((q + 1) * (q + 1) <= p.tensor) ++q;
    if (q * q != p.tensor) {
      std::string squares;
      for (int64_t s = 2; s <= 8; ++s) squares += (s > 2 ? ", " : "") + std::to_string(s * s);
      throw Error(r.where("parallel.tensor") + " = " + std::to_string(p.tensor) + ": tensor_mode = \"2d\" arranges the tensor ranks in a " +
                  "q x q grid, so tensor must be a square (" + squares + ", ...)");
    }
    m.tensor_grid = {q, q};
  }
  if (p.tensor_mode == "3d") {   // a cube of q x q x q
    int64_t q = 1;
    while ((q + 1) * (q + 1) * (q + 1) <= p.tensor) ++q;
    if (q * q * q != p.tensor)
      throw Error(r.where("parallel.tensor") + " = " + std::to_string(p.tensor) + ": tensor_mode = \"3d\" arranges the tensor ranks in a " +
                  "q x q x q cube, so tensor must be a cube (8, 27, 64, ...)");
    m.tensor_grid = {q, q, q};
  }
  if (p.tensor_mode == "2.5d") {   // d grids of q x q
    const int64_t d = p.tensor_depth;
    int64_t q = 1;
    while ((q + 1) * (q + 1) * d <= p.tensor) ++q;
    if (p.tensor % d != 0 || q * q * d != p.tensor)
      throw Error(r.where("parallel.tensor") + " = " + std::to_string(p.tensor) + ": tensor_mode = \"2.5d\" arranges the tensor ranks in " +
                  "tensor_depth = " + std::to_string(d) + " grids of q x q, so tensor must be " + std::to_string(d) + " x a square (" +
                  std::to_string(4 * d) + ", " + std::to_string(9 * d) + ", ...)");
    m.tensor_grid = {d, q, q};
  }
  if (p.data == 0) {   // auto
    if (world % others != 0) {
      const std::string key = r.locations.count("parallel.tensor") ? "parallel.tensor"
                              : r.locations.count("parallel.pipeline") ? "parallel.pipeline" : "parallel.sequence";
      throw Error(r.where(key) + ": " + sizes + " = " + std::to_string(others) + " ranks does not divide the world of " +
                                          std::to_string(world) + " (data = \"auto\" needs a multiple of it)");
    }
    m.size[static_cast<int>(Dim::dp)] = world / others;
  } else {
    if (p.data * others != world)
      throw Error(r.where("parallel.data") + " = " + std::to_string(p.data) + ": data " + std::to_string(p.data) + " x " + sizes + " = " +
                            std::to_string(p.data * others) + " ranks, but the world has " + std::to_string(world) +
                            (world % others == 0 ? " (set data = " + std::to_string(world / others) + " or \"auto\")"
                                                 : " (the sizes' product must equal the world size)"));
    m.size[static_cast<int>(Dim::dp)] = p.data;
  }
  return m;
}

int64_t MeshLayout::stride(Dim d) const {
  int64_t s = 1;
  for (int i = 3; i > static_cast<int>(d); --i) s *= shape_.size[i];
  return s;
}

int64_t MeshLayout::coordinate(int64_t rank, Dim d) const { return (rank / stride(d)) % shape_.of(d); }

std::vector<int64_t> MeshLayout::group_ranks(int64_t rank, Dim d) const {
  const int64_t first = rank - coordinate(rank, d) * stride(d);
  std::vector<int64_t> ranks;
  for (int64_t i = 0; i < shape_.of(d); ++i) ranks.push_back(first + i * stride(d));
  return ranks;
}

int64_t MeshLayout::group_index(int64_t rank, Dim d) const {
  // Drop the coordinate along d and number the remaining ones in rank order.
  const int64_t s = stride(d);
  return (rank / (s * shape_.of(d))) * s + rank % s;
}

}  // namespace colossal::dist
