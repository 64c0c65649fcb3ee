# Finds LibTorch inside the torch wheel of the project's virtual environment and works around the
# wheel's build traps (each one verified on Debian 12 with CMake 3.25 and torch 2.15 +cu132):
#  1. with nvcc installed, Caffe2's CUDA detection does a try_run that fails under CMake 3.25 unless
#     TORCH_CUDA_ARCH_LIST is set, even for a CPU-only build;
#  2. libtorch_cuda needs the wheel's nvidia/*/lib folders as -rpath-link, or the system's older
#     NCCL is picked and the link fails;
#  3. torch/include ships fmt 12 but Debian's spdlog needs its own fmt 9 (handled in header_deps.cmake).
#  4. (torch 2.11) libtorch.so's exported std::filesystem must not win symbol resolution, see below.
# Exports TORCH_LIBRARIES and COLOSSAL_TORCH_LINK_OPTIONS.

set(COLOSSAL_PYTHON "${PROJECT_SOURCE_DIR}/.venv/bin/python" CACHE FILEPATH "Python whose torch provides LibTorch")
if(NOT EXISTS "${COLOSSAL_PYTHON}")
  find_program(COLOSSAL_PYTHON_FALLBACK python3)
  set(COLOSSAL_PYTHON "${COLOSSAL_PYTHON_FALLBACK}")
endif()
execute_process(
  COMMAND "${COLOSSAL_PYTHON}" -c "import torch, os; print(torch.utils.cmake_prefix_path); print(os.path.dirname(os.path.dirname(torch.__file__))); print(torch.__version__)"
  OUTPUT_VARIABLE _torch_info RESULT_VARIABLE _torch_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _torch_rc EQUAL 0)
  message(FATAL_ERROR "colossal: ${COLOSSAL_PYTHON} cannot import torch; run scripts/setup.sh first")
endif()
string(REPLACE "\n" ";" _torch_info "${_torch_info}")
list(GET _torch_info 0 _torch_prefix)
list(GET _torch_info 1 _site_packages)
list(GET _torch_info 2 COLOSSAL_TORCH_VERSION)
list(APPEND CMAKE_PREFIX_PATH "${_torch_prefix}")

if(NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST} AND NOT TORCH_CUDA_ARCH_LIST)   # trap 1
  set(ENV{TORCH_CUDA_ARCH_LIST} "8.0;9.0")
  set(TORCH_CUDA_ARCH_LIST "8.0;9.0")
endif()
find_package(Torch REQUIRED)
message(STATUS "colossal: LibTorch ${COLOSSAL_TORCH_VERSION} from ${_torch_prefix}")

# torch 2.11's libtorch.so exports its own broken copy of std::filesystem (64 symbols; remove_all
# jumps through a null pointer). libstdc++ goes first in every executable's DT_NEEDED list so the
# dynamic linker binds those symbols to it, whichever LibTorch is used. It is named by its full path:
# a toolchain whose own `-lstdc++` is static (the GPU machine's /opt/gcc) would otherwise add no entry.
execute_process(COMMAND "${CMAKE_CXX_COMPILER}" -print-file-name=libstdc++.so
                OUTPUT_VARIABLE _compiler_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
if(IS_ABSOLUTE "${_compiler_libstdcxx}" AND EXISTS "${_compiler_libstdcxx}")
  set(COLOSSAL_LIBSTDCXX "${_compiler_libstdcxx}" CACHE FILEPATH "libstdc++ put first in DT_NEEDED")
else()   # the compiler has no shared libstdc++ of its own: the system's, which LibTorch loads anyway
  find_library(COLOSSAL_LIBSTDCXX NAMES libstdc++.so.6 libstdc++.so REQUIRED)
endif()
get_filename_component(_libstdcxx "${COLOSSAL_LIBSTDCXX}" REALPATH)
message(STATUS "colossal: libstdc++ first in DT_NEEDED: ${_libstdcxx}")
set(COLOSSAL_TORCH_LINK_OPTIONS "LINKER:--push-state,--no-as-needed,${_libstdcxx},--pop-state")
# trap 2: the wheel's nvidia/*/lib folders as -rpath-link
file(GLOB _nvidia_libs LIST_DIRECTORIES true "${_site_packages}/nvidia/*/lib" "${_site_packages}/nvidia/*/*/lib")
foreach(_dir ${_nvidia_libs})
  list(APPEND COLOSSAL_TORCH_LINK_OPTIONS "LINKER:-rpath-link,${_dir}")
endforeach()

