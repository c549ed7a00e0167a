# tide_gpu_sources(TARGET BINARY_DIR): generates BINARY_DIR/generated/gpu/sources.h
# (the GPU kernels' CUDA source as C strings, cmake/embed.cmake) and adds it
# to TARGET, with its include directory. Used by the library's build and the
# fuzzers' (fuzz/CMakeLists.txt); test/mpi_suite.sh runs embed.cmake itself.
function(tide_gpu_sources target binary_dir)
  get_filename_component(root ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/.. ABSOLUTE)
  set(header ${binary_dir}/generated/gpu/sources.h)
  add_custom_command(OUTPUT ${header}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${binary_dir}/generated/gpu
    COMMAND ${CMAKE_COMMAND} "-DINPUTS=${root}/src/gpu/select.cu\\;${root}/src/gpu/state.h"
            "-DVARS=tide__gpu_select_cu\\;tide__gpu_state_h" -DOUT=${header} -P ${root}/cmake/embed.cmake
    DEPENDS ${root}/src/gpu/select.cu ${root}/src/gpu/state.h ${root}/cmake/embed.cmake
    COMMENT "Embedding the GPU kernels' source")
  target_sources(${target} PRIVATE ${header})
  target_include_directories(${target} PRIVATE ${binary_dir}/generated)
endfunction()
