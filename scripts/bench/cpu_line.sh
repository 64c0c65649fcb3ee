#!/usr/bin/env bash
# Prints what a benchmark's machine line says about the CPU: its model, its family and model numbers
# (cloud VMs often name only "AMD EPYC", and the numbers still tell Zen 4, family 25, from Zen 5, family
# 26), its widest vector extension (from /proc/cpuinfo) and the instruction-set caps in force for
# colossal and for LibTorch, then colossal's memory settings where set (COLOSSAL_HUGE_PAGES,
# COLOSSAL_WEIGHT_STREAMS), e.g.
#   AMD EPYC 9B14 [family 25 model 17] (avx512), COLOSSAL_CPU_ISA=avx2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2
set -euo pipefail
model="$(grep -m1 '^model name' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)"
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
family="$(grep -m1 '^cpu family' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)"
number="$(grep -m1 '^model[[:space:]]*:' /proc/cpuinfo 2>/dev/null | sed 's/^[^:]*: *//' || true)"
widest=baseline
[[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]] && widest=avx2
[[ " $flags " == *" avx512f "* ]] && widest=avx512
[[ " $flags " == *" avx512f "* && " $flags " == *" avx512_vnni "* ]] && widest=avx512vnni
[[ $widest == avx512vnni && " $flags " == *" amx_tile "* && " $flags " == *" amx_int8 "* ]] && widest=amx
caps=""
for v in COLOSSAL_CPU_ISA ATEN_CPU_CAPABILITY MKL_ENABLE_INSTRUCTIONS ONEDNN_MAX_CPU_ISA; do
  [ -z "${!v:-}" ] || caps+=" $v=${!v}"
done
# colossal's own memory settings where set by hand (a decoder's speed moves with them)
settings=""
for v in COLOSSAL_HUGE_PAGES COLOSSAL_WEIGHT_STREAMS; do
  [ -z "${!v:-}" ] || settings+=" $v=${!v}"
done
echo "${model:-unknown CPU}${family:+ [family $family model $number]} ($widest),${caps:- no ISA cap}${settings:+,$settings}"
