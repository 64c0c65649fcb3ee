// Device mesh: how the world's ranks are arranged along the named parallel dimensions, and which
// ranks share a group along each. Pure arithmetic (no communication): runtime.h builds one process
// group per dimension this rank belongs to, once, from these rank lists.
//
// Rank order, outermost to innermost: pipeline, data, sequence, tensor.
//   rank = ((pp * data + dp) * sequence + sp) * tensor + tp
// Tensor parallelism is innermost because it communicates on every layer (its ranks should share a
// node's fastest links); pipeline is outermost because it sends only activations between stages and
// tolerates the slowest links. Later issues split tp again (2D/2.5D/3D) inside the same innermost block.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "src/core/recipe.h"

namespace colossal::dist {

enum class Dim { pp = 0, dp = 1, sp = 2, tp = 3 };
constexpr std::array<Dim, 4> kDims{Dim::pp, Dim::dp, Dim::sp, Dim::tp};
const char* dim_name(Dim d);   // "pp" | "dp" | "sp" | "tp"

struct MeshShape {
  std::array<int64_t, 4> size{1, 1, 1, 1};   // indexed by Dim
  // The tensor-parallel ranks as a grid (2D: {q, q}), the first axis the most significant digit of a
  // rank's tp coordinate; empty: one axis (1D).
  std::vector<int64_t> tensor_grid;
  int64_t of(Dim d) const { return size[static_cast<int>(d)]; }
  int64_t world() const { return size[0] * size[1] * size[2] * size[3]; }
  std::string describe() const;   // "dp=2 pp=1 tp=1 sp=1"
};

// The recipe's sizes against the world: data = "auto" takes what the others leave. RecipeError at
// the recipe's [parallel] key when the product does not equal the world size. tensor_mode "2d" makes
// the tensor ranks a q x q grid (a size that is not a square is refused), "2.5d" tensor_depth such grids.
MeshShape resolve_mesh(const Recipe& recipe, int64_t world);

class MeshLayout {
 public:
  explicit MeshLayout(MeshShape shape) : shape_(shape) {}
  const MeshShape& shape() const { return shape_; }
  int64_t coordinate(int64_t rank, Dim d) const;
  // Every rank that differs from `rank` only along `d`, in coordinate order (the group along d).
  std::vector<int64_t> group_ranks(int64_t rank, Dim d) const;
  // Which of the dimension's groups `rank` is in (0 .. world/size(d)-1), for naming the group.
  int64_t group_index(int64_t rank, Dim d) const;

 private:
  int64_t stride(Dim d) const;
  MeshShape shape_;
};

}  // namespace colossal::dist
