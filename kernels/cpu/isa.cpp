// Instruction-set detection and the cap: see isa.h. Compiled for baseline x86-64 like every file
// outside the *_isa.cpp set, so it runs on any CPU before one is chosen.
#include "kernels/cpu/isa.h"

#include <atomic>
#include <cstdlib>
#include <iterator>
#include <stdexcept>
#include <string>

#include "kernels/cpu/isa_kernels.h"

#if defined(__linux__) && defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace colossal::kernels {
namespace {

constexpr int kNoOverride = -1;
constexpr Isa kAll[] = {Isa::baseline, Isa::avx2, Isa::avx512, Isa::avx512vnni, Isa::amx};   // narrowest first
std::atomic<int> g_override{kNoOverride};

// Whether this process may use AMX's int8 tiles: the CPU has them, and Linux (5.16 and later) grants
// the process their 8 KiB of register state. The grant is asked for once, here, for the whole process
// (threads inherit it); without it the first tile instruction would kill the process with SIGILL.
bool amx_int8_granted() {
#if defined(__linux__) && defined(__x86_64__) && defined(COLOSSAL_KERNELS_AMX)
  if (!__builtin_cpu_supports("amx-tile") || !__builtin_cpu_supports("amx-int8")) return false;
  constexpr long kArchReqXcompPerm = 0x1023, kXfeatureTileData = 18;
  return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureTileData) == 0;
#else
  return false;
#endif
}

Isa detect() {
#if defined(__x86_64__) && defined(COLOSSAL_KERNELS_X86)
  __builtin_cpu_init();
  // The AVX-512 copies are compiled with F, VL, BW and DQ (every AVX-512 CPU since Skylake-SP has all four).
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq")) {
    if (!__builtin_cpu_supports("avx512vnni")) return Isa::avx512;
    return amx_int8_granted() ? Isa::amx : Isa::avx512vnni;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
#endif
  return Isa::baseline;
}

// The sets a machine whose widest is `machine` can run, narrowest first.
std::vector<Isa> isas_up_to(Isa machine) {
  std::vector<Isa> out;
  for (Isa isa : kAll)
    if (isa <= machine) out.push_back(isa);
  return out;
}

// "a, b, c": the sets' names in the given order, for error messages.
std::string names(const std::vector<Isa>& isas) {
  std::string out;
  for (Isa isa : isas) out += (out.empty() ? "" : ", ") + std::string(isa_name(isa));
  return out;
}

Isa env_capped() {
  static const Isa isa = isa_cap_from(std::getenv("COLOSSAL_CPU_ISA"), machine_isa());
  return isa;
}

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::amx: return "amx";
    case Isa::avx512vnni: return "avx512vnni";
    case Isa::avx512: return "avx512";
    case Isa::avx2: return "avx2";
    case Isa::baseline: return "baseline";
  }
  return "?";
}

std::optional<Isa> parse_isa(std::string_view name) {
  for (Isa isa : kAll)
    if (name == isa_name(isa)) return isa;
  return std::nullopt;
}

Isa machine_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa isa_cap_from(const char* value, Isa machine) {
  if (!value || !*value) return machine;
  const auto isa = parse_isa(value);
  if (!isa) {
    const std::vector<Isa> widest_first(std::rbegin(kAll), std::rend(kAll));
    throw std::invalid_argument(std::string("COLOSSAL_CPU_ISA=\"") + value + "\" is not an instruction set (valid: " + names(widest_first) + ")");
  }
  if (*isa > machine) {
    throw std::invalid_argument(std::string("COLOSSAL_CPU_ISA=") + value + ": this CPU cannot run " + value +
                                " code (its widest is " + isa_name(machine) + "; valid here: " + names(isas_up_to(machine)) + ")");
  }
  return *isa;
}

Isa active_isa() {
  const int o = g_override.load(std::memory_order_relaxed);
  return o == kNoOverride ? env_capped() : static_cast<Isa>(o);
}

std::vector<Isa> runnable_isas() { return isas_up_to(machine_isa()); }

ScopedIsa::ScopedIsa(Isa isa) : previous_(g_override.load()) {
  if (isa > machine_isa())
    throw std::invalid_argument(std::string("ScopedIsa: this CPU cannot run ") + isa_name(isa));
  g_override.store(static_cast<int>(isa));
}

ScopedIsa::~ScopedIsa() { g_override.store(previous_); }

const IsaKernels& isa_kernels(Isa isa) {
#if defined(COLOSSAL_KERNELS_X86)
  switch (isa) {
#if defined(COLOSSAL_KERNELS_AMX)
    case Isa::amx: return amx::table();
#else
    case Isa::amx: [[fallthrough]];   // never detected in a build without the AMX copy
#endif
    case Isa::avx512vnni: return avx512vnni::table();
    case Isa::avx512: return avx512::table();
    case Isa::avx2: return avx2::table();
    case Isa::baseline: break;
  }
#endif
  (void)isa;
  return baseline::table();
}

}  // namespace colossal::kernels
