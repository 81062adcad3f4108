# Finding the installed PyTorch, for everything in the build that uses it: the
# PyTorch allocator baseline of bench/ and the PyTorch backend of
# integrations/torch/. One place, so both build against the same torch.
#
# gvm_find_torch() asks python3 where torch is (its package directory holds
# include/ and lib/ with libc10.so and libc10_cuda.so) and which version and
# C++ ABI it is. It sets, in the caller's scope:
#   GVM_TORCH_FOUND    ON when torch can be built against
#   GVM_TORCH_DIR      the torch package directory (<site-packages>/torch)
#   GVM_TORCH_VERSION  torch.__version__, e.g. 2.11.0+cu130
#   GVM_TORCH_WHY      why not, when GVM_TORCH_FOUND is OFF (for a STATUS line)
# Without python3 or torch it sets GVM_TORCH_FOUND OFF and says why; nothing fails.
#
# GVM_TORCH_ROOT (cache) names a torch package directory to use instead of
# asking python3 (a build machine without the torch Python package);
# GVM_TORCH_VERSION must then be given too.
#
# gvm_target_use_torch(<target> <PRIVATE|PUBLIC>) adds torch's headers (as
# system headers: their warnings are not ours), the C++11 ABI, libc10,
# libc10_cuda and the shared CUDA runtime (the one libc10_cuda loads: one
# process should hold one runtime), with an rpath to torch's lib/.

set(GVM_TORCH_ROOT "" CACHE PATH "A torch package directory to build against instead of asking python3")

function(gvm_find_torch)
  set(found OFF)
  set(why "")
  set(dir "")
  set(version "")
  set(abi "")
  if(GVM_TORCH_ROOT)
    set(dir "${GVM_TORCH_ROOT}")
    set(version "${GVM_TORCH_VERSION}")
    set(abi 1)
    if(NOT version)
      set(why "GVM_TORCH_ROOT is set but GVM_TORCH_VERSION is not")
    endif()
  else()
    find_program(GVM_PYTHON3 python3)
    if(NOT GVM_PYTHON3)
      set(why "no python3")
    else()
      execute_process(
        COMMAND "${GVM_PYTHON3}" -c
          "import os, torch; print(os.path.dirname(torch.__file__)); print(int(torch._C._GLIBCXX_USE_CXX11_ABI)); print(torch.__version__)"
        RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
      if(NOT rc EQUAL 0)
        set(why "python3 (${GVM_PYTHON3}) cannot import torch")
      else()
        string(REPLACE "\n" ";" out "${out}")
        list(GET out 0 dir)
        list(GET out 1 abi)
        list(GET out 2 version)
      endif()
    endif()
  endif()
  if(NOT why)
    # The interfaces pass std::string, so torch must use this build's ABI.
    if(NOT abi EQUAL 1)
      set(why "torch ${version} is built with the pre-C++11 ABI")
    elseif(NOT TARGET CUDA::cudart)
      set(why "torch ${version}: no shared CUDA runtime (CUDA::cudart) to build against")
    elseif(NOT EXISTS "${dir}/lib/libc10_cuda.so" OR NOT EXISTS "${dir}/lib/libc10.so"
           OR NOT EXISTS "${dir}/include/c10/cuda/CUDACachingAllocator.h")
      set(why "torch ${version}: no libc10_cuda.so, libc10.so or c10 headers in ${dir}")
    else()
      set(found ON)
    endif()
  endif()
  set(GVM_TORCH_FOUND ${found} PARENT_SCOPE)
  set(GVM_TORCH_DIR "${dir}" PARENT_SCOPE)
  set(GVM_TORCH_VERSION "${version}" PARENT_SCOPE)
  set(GVM_TORCH_WHY "${why}" PARENT_SCOPE)
endfunction()

function(gvm_target_use_torch target visibility)
  target_include_directories(${target} SYSTEM ${visibility} "${GVM_TORCH_DIR}/include")
  target_compile_definitions(${target} ${visibility} _GLIBCXX_USE_CXX11_ABI=1)
  target_link_libraries(${target} ${visibility} "${GVM_TORCH_DIR}/lib/libc10_cuda.so"
                                                "${GVM_TORCH_DIR}/lib/libc10.so" CUDA::cudart)
  if(visibility STREQUAL "PRIVATE")
    target_link_options(${target} PRIVATE "-Wl,-rpath,${GVM_TORCH_DIR}/lib")
  else()
    target_link_options(${target} INTERFACE "-Wl,-rpath,${GVM_TORCH_DIR}/lib")
  endif()
endfunction()
