# Installs the package into a scratch prefix and checks it as a user would: the library files
# and links, find_package(gkrt 0.1) (and the refusal of a version it is not), pkg-config, and a
# program built each way that runs. Run by CTest (pkg_install_consumers) with BUILD_DIR,
# SOURCE_DIR, VERSION, C_COMPILER, LIBDIR and INCLUDEDIR set.
set(work ${BUILD_DIR}/pkg-check)
set(prefix ${work}/prefix)
file(REMOVE_RECURSE ${work})

function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

run(${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${prefix})
set(lib ${prefix}/${LIBDIR})
string(REGEX MATCH "^[0-9]+" major ${VERSION})

# The real file carries the full version; the SONAME link and the development link point to it.
if(IS_SYMLINK ${lib}/libgkrt.so.${VERSION} OR NOT EXISTS ${lib}/libgkrt.so.${VERSION})
  message(FATAL_ERROR "libgkrt.so.${VERSION} is not a real file")
endif()
file(READ_SYMLINK ${lib}/libgkrt.so.${major} to_real)
file(READ_SYMLINK ${lib}/libgkrt.so to_soname)
if(NOT to_real STREQUAL "libgkrt.so.${VERSION}" OR NOT to_soname STREQUAL "libgkrt.so.${major}")
  message(FATAL_ERROR "links: libgkrt.so.${major} -> ${to_real}, libgkrt.so -> ${to_soname}")
endif()
foreach(f ${lib}/libgkrt.a ${prefix}/${INCLUDEDIR}/gkrt.h
    ${lib}/cmake/gkrt/gkrtConfigVersion.cmake ${lib}/pkgconfig/gkrt.pc)
  if(NOT EXISTS ${f})
    message(FATAL_ERROR "not installed: ${f}")
  endif()
endforeach()

# find_package(gkrt 0.1): configure, build, run.
run(${CMAKE_COMMAND} -S ${SOURCE_DIR}/c_tests/package -B ${work}/cmake-consumer
  -DCMAKE_PREFIX_PATH=${prefix} -DGKRT_WANT=0.1 -DCMAKE_C_COMPILER=${C_COMPILER})
run(${CMAKE_COMMAND} --build ${work}/cmake-consumer)
run(${work}/cmake-consumer/consumer)
message(STATUS "find_package(gkrt 0.1): ${last_output}")

# A version the package is not must be refused.
execute_process(COMMAND ${CMAKE_COMMAND} -S ${SOURCE_DIR}/c_tests/package -B ${work}/cmake-wrong
  -DCMAKE_PREFIX_PATH=${prefix} -DGKRT_WANT=1.0 -DCMAKE_C_COMPILER=${C_COMPILER}
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
if(rc EQUAL 0)
  message(FATAL_ERROR "find_package(gkrt 1.0) accepted version ${VERSION}")
endif()

# pkg-config: flags from the installed gkrt.pc; an rpath so the program runs without
# LD_LIBRARY_PATH (README: ldconfig or an rpath).
find_program(PKG_CONFIG pkg-config REQUIRED)
set(ENV{PKG_CONFIG_PATH} ${lib}/pkgconfig)
run(${PKG_CONFIG} --cflags --libs gkrt)
string(STRIP "${last_output}" flags)
separate_arguments(flags UNIX_COMMAND "${flags}")
run(${C_COMPILER} ${SOURCE_DIR}/c_tests/package/consumer.c ${flags} -Wl,-rpath,${lib} -o ${work}/pc-consumer)
run(${work}/pc-consumer)
message(STATUS "pkg-config: ${last_output}")
