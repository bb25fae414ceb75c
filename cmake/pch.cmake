# One precompiled header for every target: LibTorch's C++ frontend plus the standard library.
# The first target compiles it; the others reuse it (they all share compile flags, see
# CMAKE_POSITION_INDEPENDENT_CODE and DEFINE_SYMBOL in the top-level CMakeLists).
function(pipetrain_use_pch target)
  get_property(owner GLOBAL PROPERTY PIPETRAIN_PCH_OWNER)
  if(NOT owner)
    target_precompile_headers(${target} PRIVATE
      <torch/torch.h> <vector> <string> <memory> <functional> <map> <unordered_map>
      <thread> <mutex> <condition_variable> <chrono> <atomic> <optional> <sstream>)
    set_property(GLOBAL PROPERTY PIPETRAIN_PCH_OWNER ${target})
  else()
    target_precompile_headers(${target} REUSE_FROM ${owner})
  endif()
endfunction()
