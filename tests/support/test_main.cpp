// main() of every test binary: GoogleTest's, except that a run whose every selected test skipped
// (a GPU test where no GPU is) exits 77, which ctest shows as skipped (cmake/gtest_suites.cmake runs
// one process per suite, so a suite of GPU tests shows as one skipped entry).
#include <gtest/gtest.h>
#include <stdlib.h>

int main(int argc, char** argv) {
  // No kernel-choice cache shared between tests (src/engine/kernel_cache.h): each colossal process
  // they start times its own choices, as before the cache, unless a test names a file of its own.
  setenv("COLOSSAL_KERNEL_CACHE", "off", /*overwrite=*/0);
  testing::InitGoogleTest(&argc, argv);
  const int rc = RUN_ALL_TESTS();
  const auto* run = testing::UnitTest::GetInstance();
  if (rc == 0 && run->test_to_run_count() > 0 && run->skipped_test_count() == run->test_to_run_count()) return 77;
  return rc;
}
