# Compile through ccache. The sloppiness settings let ccache cache translation units that use
# the shared precompiled header (LibTorch's headers cost ~20 s per unit without it).
if(PIPETRAIN_USE_CCACHE AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(PIPETRAIN_CCACHE ccache)
  if(PIPETRAIN_CCACHE)
    set(CMAKE_CXX_COMPILER_LAUNCHER
      ${CMAKE_COMMAND} -E env
      CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
      CCACHE_BASEDIR=${CMAKE_SOURCE_DIR}
      CCACHE_COMPRESS=1
      ${PIPETRAIN_CCACHE})
    message(STATUS "pipetrain: compiling through ${PIPETRAIN_CCACHE}")
  endif()
endif()
