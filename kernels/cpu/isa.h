// Instruction-set dispatch for the CPU kernels. The hot loops of every kernel live in *_isa.cpp files
// that CMake compiles once per instruction set (baseline x86-64, AVX2 + FMA, AVX-512), each copy in
// its own namespace with register blocks sized for that set's vector width and register count (16
// registers of 8 floats on AVX2, 32 of 16 on AVX-512). At run time the widest set the CPU supports is
// used, capped by COLOSSAL_CPU_ISA=amx|avx512vnni|avx512|avx2|baseline (read once), so the AVX2 and baseline paths
// can be run, tested and benchmarked on an AVX-512 machine. Tests cap it in-process with ScopedIsa.
// avx512vnni is AVX-512 plus its byte dot product (Cascade Lake, Ice Lake, Sapphire Rapids, Zen 4 and
// later): every kernel is the avx512 copy except the quantized decoding GEMV's integer dot products,
// which take one vpdpbusd where AVX-512 without VNNI needs two multiplies (same sums, same bits), and
// the quantized prompt GEMM (qgemm.h), whose avx2 and avx512 copy splits x to multiply bytes in pairs.
// amx is avx512vnni plus AMX's int8 tiles (Sapphire Rapids and later, where the kernel grants the
// process their state): the same kernels, except that the prompt GEMM multiplies whole tiles of 16 x
// rows by 16 columns per instruction (the same integer sums, so the same bits as avx512vnni's).
#pragma once
#include <optional>
#include <string_view>
#include <vector>

namespace colossal::kernels {

enum class Isa : int { baseline = 0, avx2 = 1, avx512 = 2, avx512vnni = 3, amx = 4 };

const char* isa_name(Isa isa);
std::optional<Isa> parse_isa(std::string_view name);

// The widest set this CPU and this build support (baseline where the build is not x86-64).
Isa machine_isa();

// The set the kernels use: a ScopedIsa in force, else machine_isa() capped by COLOSSAL_CPU_ISA.
// Throws std::invalid_argument when the variable names no set, or one this machine cannot run.
Isa active_isa();

// What COLOSSAL_CPU_ISA=`value` means on a machine whose widest set is `machine`: the cap, or the
// std::invalid_argument active_isa() throws. An empty or null value means no cap.
Isa isa_cap_from(const char* value, Isa machine);

// Every set this machine can run, narrowest first (for tests that check each one).
std::vector<Isa> runnable_isas();

// While alive, the kernels run with `isa` (which must be at most machine_isa()). Not thread-safe:
// for tests and benchmarks that compare paths inside one process.
class ScopedIsa {
 public:
  explicit ScopedIsa(Isa isa);
  ~ScopedIsa();
  ScopedIsa(const ScopedIsa&) = delete;
  ScopedIsa& operator=(const ScopedIsa&) = delete;

 private:
  int previous_;
};

}  // namespace colossal::kernels
