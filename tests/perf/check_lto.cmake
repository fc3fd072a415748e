# Each object of OBJECTS must hold both GCC's LTO intermediate code (.gnu.lto_ sections) and machine
# code (.text): fat LTO objects, as CHORUS_LTO builds them.
if(NOT OBJECTS)
  message(FATAL_ERROR "no objects to check")
endif()
foreach(obj IN LISTS OBJECTS)
  execute_process(COMMAND ${READELF} -S -W ${obj} OUTPUT_VARIABLE sections RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "readelf failed on ${obj}")
  endif()
  if(NOT sections MATCHES "\\.gnu\\.lto_")
    message(FATAL_ERROR "${obj} has no LTO intermediate code: libchorus.so and chorus-perf were not link-time optimised")
  endif()
  if(NOT sections MATCHES " \\.text")
    message(FATAL_ERROR "${obj} has no machine code: the test programs cannot link it without LTO")
  endif()
endforeach()
list(LENGTH OBJECTS n)
message(STATUS "${n} fat LTO objects")

# LTO_PROGRAMS were linked with link-time optimisation (their symbol tables hold the .lto_priv.
# names GCC gives the local functions it optimises across units); PLAIN_PROGRAMS, linked from the
# same fat objects, must not be (CMakeLists.txt: -fno-lto, else every test program's link would
# optimise the whole library again).
foreach(kind IN ITEMS LTO PLAIN)
  foreach(prog IN LISTS ${kind}_PROGRAMS)
    execute_process(COMMAND ${NM} ${prog} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
    if(NOT rc EQUAL 0)
      message(FATAL_ERROR "nm failed on ${prog}")
    endif()
    if(kind STREQUAL LTO AND NOT symbols MATCHES "\\.lto_priv\\.")
      message(FATAL_ERROR "${prog} was not link-time optimised")
    elseif(kind STREQUAL PLAIN AND symbols MATCHES "\\.lto_priv\\.")
      message(FATAL_ERROR "${prog} was link-time optimised: its link should take the objects' machine code")
    endif()
  endforeach()
endforeach()
