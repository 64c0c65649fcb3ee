# Dependencies found by path rather than pkg-config, so the same CMakeLists also configures where
# Debian's -dev packages are only unpacked under a prefix (CMAKE_PREFIX_PATH) and no pkg-config exists,
# as on the GPU machine (scripts/dev/gpu_check.sh). Exports colossal::sentencepiece,
# colossal::tomlplusplus, colossal::liburing, colossal::httplib and COLOSSAL_FMT_SHIM.

find_path(SENTENCEPIECE_INCLUDE_DIR sentencepiece_processor.h REQUIRED)
find_library(SENTENCEPIECE_LIBRARY sentencepiece REQUIRED)
find_library(SENTENCEPIECE_TRAIN_LIBRARY sentencepiece_train REQUIRED)   # `data tokenizer` trains models
add_library(colossal::sentencepiece INTERFACE IMPORTED)
set_target_properties(colossal::sentencepiece PROPERTIES
  INTERFACE_LINK_LIBRARIES "${SENTENCEPIECE_TRAIN_LIBRARY};${SENTENCEPIECE_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${SENTENCEPIECE_INCLUDE_DIR}")

# TOML++ is used header-only (Debian 12's config would switch it to its shared library instead).
find_path(TOMLPLUSPLUS_INCLUDE_DIR toml++/toml.h REQUIRED)
add_library(colossal::tomlplusplus INTERFACE IMPORTED)
set_target_properties(colossal::tomlplusplus PROPERTIES INTERFACE_INCLUDE_DIRECTORIES "${TOMLPLUSPLUS_INCLUDE_DIR}")

# Wheel trap 3: torch/include ships fmt 12, Debian's spdlog needs the fmt 9 it was built with. A build-tree
# folder holding only a `fmt` link to spdlog's fmt goes before torch's include directories.
get_target_property(_fmt_includes fmt::fmt INTERFACE_INCLUDE_DIRECTORIES)
find_path(COLOSSAL_FMT_INCLUDE_DIR fmt/format.h HINTS ${_fmt_includes} NO_DEFAULT_PATH)
find_path(COLOSSAL_FMT_INCLUDE_DIR fmt/format.h REQUIRED)
set(COLOSSAL_FMT_SHIM "${CMAKE_BINARY_DIR}/fmt-shim")
file(MAKE_DIRECTORY "${COLOSSAL_FMT_SHIM}")
file(REMOVE "${COLOSSAL_FMT_SHIM}/fmt")
file(CREATE_LINK "${COLOSSAL_FMT_INCLUDE_DIR}/fmt" "${COLOSSAL_FMT_SHIM}/fmt" SYMBOLIC)

# liburing (Debian's liburing-dev) for the NVMe offload tier's asynchronous I/O. Optional: without it
# (the GPU machine has no -dev packages) the offload file runs its transfers through pread/pwrite.
find_path(LIBURING_INCLUDE_DIR liburing.h)
find_library(LIBURING_LIBRARY uring)
add_library(colossal::liburing INTERFACE IMPORTED)
if(LIBURING_INCLUDE_DIR AND LIBURING_LIBRARY)
  set_target_properties(colossal::liburing PROPERTIES
    INTERFACE_LINK_LIBRARIES "${LIBURING_LIBRARY}"
    INTERFACE_INCLUDE_DIRECTORIES "${LIBURING_INCLUDE_DIR}")   # the source tests __has_include(<liburing.h>)
else()
  message(STATUS "liburing not found: NVMe offload uses pread/pwrite")
endif()

# cpp-httplib (Debian's libcpp-httplib-dev) for `colossal serve`. Debian splits it: the header declares,
# libcpp-httplib.so defines, and it was built with OpenSSL, zlib and Brotli support, which change the
# classes the header declares, so every unit that includes it defines the same three (its pkg-config Cflags).
find_path(HTTPLIB_INCLUDE_DIR httplib.h REQUIRED)
find_library(HTTPLIB_LIBRARY cpp-httplib REQUIRED)
add_library(colossal::httplib INTERFACE IMPORTED)
set_target_properties(colossal::httplib PROPERTIES
  INTERFACE_LINK_LIBRARIES "${HTTPLIB_LIBRARY}"
  INTERFACE_INCLUDE_DIRECTORIES "${HTTPLIB_INCLUDE_DIR}"
  INTERFACE_COMPILE_DEFINITIONS "CPPHTTPLIB_OPENSSL_SUPPORT;CPPHTTPLIB_ZLIB_SUPPORT;CPPHTTPLIB_BROTLI_SUPPORT")
