# cmake -DCOMMANDS=<compile_commands.json> -P check_consumer_flags.cmake
# A consumer's compile line holds the consumer's own flags and none of longattn's tuning flags
# (exported targets carry no architecture or tuning options).
file(READ "${COMMANDS}" commands)
if(NOT commands MATCHES "-DLONGATTN_CONSUMER_OWN_FLAG")
  message(FATAL_ERROR "the consumer's own CMAKE_CXX_FLAGS are missing from its compile line:\n${commands}")
endif()
foreach(flag IN ITEMS -mprefer-vector-width)
  if(commands MATCHES "${flag}")
    message(FATAL_ERROR "longattn's tuning flag ${flag} reached the consumer's compile line:\n${commands}")
  endif()
endforeach()
message(STATUS "consumer compile line: its own flags, none of longattn's tuning flags")
