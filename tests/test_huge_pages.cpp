// A CPU decoder's weights moved onto huge pages (src/memory/huge_pages.h): every tensor keeps its values,
// shape, strides and offset; tensors sharing a storage (tied weights, views) still share it; each
// storage starts on a cache line of one 2 MiB-aligned allocation; other devices' tensors and empty ones
// are left alone; values about to be overwritten are not copied; and COLOSSAL_HUGE_PAGES takes 1, 0 or
// nothing (the command's default) and no other value.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <cstdint>

#include "src/core/error.h"
#include "src/memory/huge_pages.h"

using namespace colossal;
using namespace colossal::memory;

namespace {

uintptr_t address(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.storage().data()); }

}  // namespace

TEST(HugePages, TensorsKeepTheirValuesShapesAndSharingInOneAlignedAllocation) {
  at::manual_seed(7);
  auto a = at::randn({300, 77});                            // an odd byte count: the next storage is rounded up to 64
  const auto tied = a;                                      // the same tensor under two names (an LM head tied to its embedding)
  const auto view = a.narrow(0, 10, 20).t();                // a strided view into a's storage, at an offset
  const auto b = at::randint(-128, 127, {5, 33}, at::kChar);   // a quantized layer's integers
  const auto c = at::randn({4096});
  const auto empty = at::empty({0});
  const auto a0 = a.clone(), view0 = view.clone(), b0 = b.clone(), c0 = c.clone();
  const auto old_a = address(a);

  const auto placed = move_to_huge_pages({a, tied, view, b, c, empty, at::Tensor()});

  EXPECT_EQ(placed.storages, 3);
  EXPECT_EQ(placed.bytes, 300 * 77 * 4 + 5 * 33 + 4096 * 4);
  EXPECT_FALSE(placed.mode.empty());
  EXPECT_NE(address(a), old_a);
  EXPECT_TRUE(at::equal(a, a0));
  EXPECT_TRUE(at::equal(view, view0));
  EXPECT_TRUE(at::equal(b, b0));
  EXPECT_TRUE(at::equal(c, c0));
  EXPECT_EQ(view.storage_offset(), 10 * 77);
  EXPECT_EQ(view.strides(), (std::vector<int64_t>{1, 77}));
  // Still one storage: a write through one name shows through the others.
  a[11][3].fill_(42.0f);
  EXPECT_EQ(tied[11][3].item<float>(), 42.0f);
  EXPECT_EQ(view[3][1].item<float>(), 42.0f);
  // One allocation, 2 MiB-aligned at its start, every storage on a cache line, in the order given.
  EXPECT_EQ(address(a) % (uintptr_t{2} << 20), 0u);
  for (const auto& t : {a, b, c}) EXPECT_EQ(address(t) % 64, 0u);
  EXPECT_EQ(address(b), address(a) + (300 * 77 * 4 + 63) / 64 * 64);
  EXPECT_EQ(address(c), address(b) + (5 * 33 + 63) / 64 * 64);
  EXPECT_EQ(empty.numel(), 0);
}

TEST(HugePages, TheAllocationLivesUntilItsLastStorageGoes) {
  at::Tensor kept;
  {
    auto a = at::full({1000}, 3.0f), b = at::full({2000}, 5.0f);
    move_to_huge_pages({a, b});
    kept = b;
  }   // a's storage is gone; b's, in the same allocation, must still read (AddressSanitizer would see a use after free)
  EXPECT_EQ(kept.sum().item<float>(), 10000.0f);
  EXPECT_EQ(move_to_huge_pages({}).bytes, 0);
}

TEST(HugePages, TheVariableTakesOneOrZeroOrTheCommandsDefaultAndAnythingElseIsAnErrorNamingIt) {
  for (const bool by_default : {false, true}) {
    EXPECT_EQ(huge_pages_wanted_from(nullptr, by_default), by_default);
    EXPECT_EQ(huge_pages_wanted_from("", by_default), by_default);
    EXPECT_TRUE(huge_pages_wanted_from("1", by_default));
    EXPECT_FALSE(huge_pages_wanted_from("0", by_default));
  }
  try {
    huge_pages_wanted_from("yes", true);
    FAIL() << "accepted COLOSSAL_HUGE_PAGES=yes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("COLOSSAL_HUGE_PAGES=\"yes\""), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("valid: 1"), std::string::npos) << e.what();
  }
}

TEST(HugePages, DiscardedValuesAreNotCopiedAndTheStoragesStillTakeWrites) {
  auto a = at::empty({1000}), b = at::empty({10, 10});
  const auto placed = move_to_huge_pages({a, b}, Values::discard);
  EXPECT_EQ(placed.bytes, (1000 + 100) * 4);
  a.fill_(2.0f);   // what a checkpoint's load does next
  b.copy_(at::arange(100, at::kFloat).view({10, 10}));
  EXPECT_EQ(a.sum().item<float>(), 2000.0f);
  EXPECT_EQ(b.sum().item<float>(), 4950.0f);
  EXPECT_EQ(address(b), address(a) + 4032);   // 4000 bytes rounded up to a cache line
}
